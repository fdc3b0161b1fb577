"""The master's op log for etcd HA: what a new leader needs to rebuild object metadata.

Design: one etcd key per live fact, holding its latest state, instead of an append log. Under
``mooncake-store/<cluster_id>/oplog/`` a mounted segment is ``segments/<segment id>`` (its spec
and owner) and a complete memory replica is ``replicas/<segment id>/<object key>`` (address, size,
checksum). PUT_END (and a finished promotion) writes a replica key; REMOVE, PUT_REVOKE, eviction
and overwrite delete it; SEGMENT_UNMOUNT deletes the segment key and its replica prefix. Why not
an append log plus snapshots: the latest-state keys *are* the snapshot, so there is nothing to
trim, no snapshot to schedule, and replay is one range read whose size is the live state, never
the history. What an append log would add (ordering across keys) a replay does not need, since
every replica is independent of every other.

:class:`OpLogJournal` is the master's segment journal (:mod:`store.segment_journal`) that also
records these writes; the daemon takes them in :class:`Batch` es (latest state per key, so a put
completed and removed before the flush costs one delete) and writes each in one etcd transaction.
:func:`replay` rebuilds a fresh :class:`store.master_state.MasterState` from the keys read back.
Disk replicas are not logged: their owner re-reports them, as without the log.

Pure: no etcd, no clock; the daemon holds the store lock around every call.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from urllib.parse import quote, unquote

from store.objects import ReportedObject, Segment, SegmentState
from store.segment_journal import SegmentJournal

SEGMENTS = "segments/"
REPLICAS = "replicas/"


def segment_key(segment_id: str) -> str:
    return SEGMENTS + quote(segment_id, safe="")  # segment ids hold "/"; keep one path level


def replica_prefix(segment_id: str) -> str:
    return f"{REPLICAS}{quote(segment_id, safe='')}/"


@dataclass
class Batch:
    """Writes with no two touching the same key, so one etcd transaction can carry them."""

    puts: dict[str, str | None] = field(default_factory=dict)  # None deletes
    delete_prefixes: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.puts) + len(self.delete_prefixes)

    def covers(self, key: str) -> bool:
        return any(key.startswith(prefix) for prefix in self.delete_prefixes)


class OpLogJournal(SegmentJournal):
    def __init__(self) -> None:
        super().__init__()
        self.num_changes = 0  # recorded so far: a PutEnd is durable once this many are written
        self._batches = [Batch()]
        self._segments: dict[str, str] = {}  # segment key -> value as last handed out

    def completed(self, segment_id: str, key: str, address: int, size: int,
                  checksum: int | None, hard_pinned: bool) -> None:
        super().completed(segment_id, key, address, size, checksum, hard_pinned)
        self._put(replica_prefix(segment_id) + key, json.dumps(
            {"address": address, "size": size, "checksum": checksum, "hard_pinned": hard_pinned}))

    def gone(self, segment_id: str, key: str, address: int) -> None:
        super().gone(segment_id, key, address)
        self._put(replica_prefix(segment_id) + key, None)

    def forget(self, segment_id: str) -> None:
        super().forget(segment_id)
        prefix = replica_prefix(segment_id)
        batch = self._batches[-1]
        for key in [k for k in batch.puts if k.startswith(prefix)]:
            del batch.puts[key]  # superseded by the prefix delete
        batch.delete_prefixes.add(prefix)
        self.num_changes += 1

    def replayed(self, report: ReportedObject) -> None:
        """Tell the segment's owner of an object read back from etcd (it may have missed it),
        without writing it to etcd again."""
        SegmentJournal.completed(self, report.segment_id, report.key, report.address, report.size,
                                 report.checksum, report.hard_pinned)

    def take(self, segments: dict[str, SegmentState]) -> tuple[list[Batch], int]:
        """What is not handed out yet, and the change count it brings etcd up to. Segments are
        compared with what was handed out last, as mounts are not journal events."""
        batches, self._batches = [b for b in self._batches if len(b)], [Batch()]
        current = {segment_key(sid): json.dumps({"client_id": s.client_id, "spec": asdict(s.spec)})
                   for sid, s in segments.items()}
        diff = Batch({k: v for k, v in current.items() if self._segments.get(k) != v}
                     | {k: None for k in self._segments if k not in current})
        self._segments = current
        return ([diff] if len(diff) else []) + batches, self.num_changes

    def _put(self, key: str, value: str | None) -> None:
        if self._batches[-1].covers(key):
            self._batches.append(Batch())  # after a prefix delete of its segment: a later txn
        self._batches[-1].puts[key] = value
        self.num_changes += 1


def replay(state, entries: dict[str, str], now: float) -> int:
    """Rebuild ``state`` (a fresh MasterState with an OpLogJournal) from the op-log keys
    (relative to the oplog prefix). Segments come back unregistered, so their owners are told to
    re-mount and their engines republish; one whose owner never does is dropped after the client
    TTL with its objects, as for any silent client. Returns the number of objects rebuilt."""
    for key, value in entries.items():
        if key.startswith(SEGMENTS):
            record = json.loads(value)
            state.mount_segment(record["client_id"], Segment(**record["spec"]), now)
            state.clients[record["client_id"]].registered = False
    num_objects = 0
    for key, value in entries.items():
        if not key.startswith(REPLICAS):
            continue
        quoted, _, object_key = key[len(REPLICAS):].partition("/")
        segment = state.segments.get(unquote(quoted))
        if segment is None:
            continue  # its segment's record was lost with a failed write: nothing to place it in
        fields = json.loads(value)
        report = ReportedObject(object_key, segment.segment_id, fields["address"], fields["size"],
                                fields["checksum"], fields["hard_pinned"])
        if state._adopt(segment.client_id, report, now):
            state.journal.replayed(report)
            num_objects += 1
    return num_objects


def record_adopted(state, keys: list[str]) -> None:
    """Log objects a re-mounting owner reported that the log lacked (adopted, not PutEnd)."""
    for key in keys:
        obj = state.objects.get(key)
        for replica in obj.replicas if obj is not None else []:
            if replica.in_memory:
                state.journal.completed(replica.segment_id, key, replica.address, obj.size,
                                        obj.checksum, obj.hard_pinned)
