"""The master's op log for etcd HA: what a new leader needs to rebuild object metadata.

Design: one etcd key per live fact, holding its latest state, instead of an append log. Under
``mooncake-store/<cluster_id>/oplog/`` a mounted segment is ``segments/<segment id>`` (its spec
and owner), a complete memory replica is ``replicas/<segment id>/<object key>`` (address, size,
checksum), a disk replica is ``disk/<segment id>/<object key>`` (size, checksum), an eviction
victim handed to its owner to copy to disk is ``offloads/<object key>`` (its source replica) and
a tenant quota set at run time (``store.set_tenant_quota``) is ``quotas/<tenant>`` (its bytes:
the settings' quotas are every master's own, a run-time one only the log's).
PUT_END (and a finished promotion) writes a replica key; REMOVE, PUT_REVOKE, eviction and
overwrite delete it; a reported (or re-reported) disk copy writes a disk key, and whatever drops
the file deletes it; SEGMENT_UNMOUNT deletes the segment key and both its replica prefixes. Why not
an append log plus snapshots: the latest-state keys *are* the snapshot, so there is nothing to
trim, no snapshot to schedule, and replay is one range read whose size is the live state, never
the history. What an append log would add (ordering across keys) a replay does not need, since
every replica is independent of every other.

:class:`OpLogJournal` is the master's segment journal (:mod:`store.segment_journal`) that also
records these writes; the daemon takes them in :class:`Batch` es (latest state per key, so a put
completed and removed before the flush costs one delete) and writes each in one etcd transaction.
:func:`replay` rebuilds a fresh :class:`store.master_state.MasterState` from the keys read back,
so an object held only on disk is readable at once, not only once its owner re-mounts, and a
pending hand-over is handed to the owner again rather than forgotten with its memory kept.

Disk copies are not waited for as PutEnd is: until the disk key is written, neither is the
delete of the memory replica its hand-over freed (it comes later in the same batch, or in a later
one), so a successor that misses the copy still holds the object in memory, and the owner
re-reports its file on remount.

Pure: no etcd, no clock; the daemon holds the store lock around every call.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from urllib.parse import quote, unquote

from store.objects import ReportedObject, Segment, SegmentState
from store.segment_journal import Completion, SegmentJournal

SEGMENTS = "segments/"
REPLICAS = "replicas/"
DISK = "disk/"
OFFLOADS = "offloads/"
QUOTAS = "quotas/"


def segment_key(segment_id: str) -> str:
    return SEGMENTS + quote(segment_id, safe="")  # segment ids hold "/"; keep one path level


def replica_prefix(segment_id: str) -> str:
    return f"{REPLICAS}{quote(segment_id, safe='')}/"


def disk_prefix(segment_id: str) -> str:
    return f"{DISK}{quote(segment_id, safe='')}/"


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
        self._offloads: set[str] = set()  # object keys whose hand-over was handed out

    def completed(self, segment_id: str, key: str, address: int, size: int,
                  checksum: int | None, hard_pinned: bool) -> None:
        super().completed(segment_id, key, address, size, checksum, hard_pinned)
        self._put_replica(segment_id, key, address, size, checksum, hard_pinned)

    def completed_many(self, completions: list[Completion]) -> None:
        super().completed_many(completions)
        for completion in completions:
            self._put_replica(*completion)

    def _put_replica(self, segment_id: str, key: str, address: int, size: int,
                     checksum: int | None, hard_pinned: bool) -> None:
        self._put(replica_prefix(segment_id) + key, json.dumps(
            {"address": address, "size": size, "checksum": checksum, "hard_pinned": hard_pinned}))

    def gone(self, segment_id: str, key: str, address: int) -> None:
        super().gone(segment_id, key, address)
        self._put(replica_prefix(segment_id) + key, None)

    def disk_gone(self, segment_id: str, key: str) -> None:
        super().disk_gone(segment_id, key)
        self._put(disk_prefix(segment_id) + key, None)

    def disk_added(self, segment_id: str, key: str, size: int, checksum: int,
                   hard_pinned: bool) -> None:
        super().disk_added(segment_id, key, size, checksum, hard_pinned)
        self._put(disk_prefix(segment_id) + key, json.dumps(
            {"size": size, "checksum": checksum, "hard_pinned": hard_pinned}))

    def offload(self, segment_id: str, key: str, address: int, size: int, checksum: int) -> None:
        super().offload(segment_id, key, address, size, checksum)
        # Keyed by object, not segment: a victim is handed over once, whichever segment it is on.
        self._put(OFFLOADS + key, json.dumps(
            {"segment_id": segment_id, "address": address, "size": size, "checksum": checksum}))
        self._offloads.add(key)

    def quota_set(self, tenant: str, quota: int) -> None:
        super().quota_set(tenant, quota)
        self._put(QUOTAS + quote(tenant, safe=""), json.dumps({"quota": quota}))

    def forget(self, segment_id: str) -> None:
        super().forget(segment_id)
        batch = self._batches[-1]
        for prefix in (replica_prefix(segment_id), disk_prefix(segment_id)):
            for key in [k for k in batch.puts if k.startswith(prefix)]:
                del batch.puts[key]  # superseded by the prefix delete
            batch.delete_prefixes.add(prefix)
        self.num_changes += 1

    def replayed(self, report: ReportedObject) -> None:
        """Tell the segment's owner of an object read back from etcd (it may have missed it),
        without writing it to etcd again."""
        SegmentJournal.completed(self, report.segment_id, report.key, report.address, report.size,
                                 report.checksum, report.hard_pinned)

    def take(self, segments: dict[str, SegmentState],
             offload_pending: dict[str, float]) -> tuple[list[Batch], int]:
        """What is not handed out yet, and the change count it brings etcd up to. Segments and
        the end of hand-overs (``offload_pending``, by key) are compared with what was handed
        out last: neither mounts nor the many ways a hand-over ends are journal events."""
        for key in [k for k in self._offloads if k not in offload_pending]:
            self._put(OFFLOADS + key, None)
            self._offloads.discard(key)
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
    TTL with its objects, as for any silent client. Memory replicas come before disk ones, which
    would otherwise leave their object out of the LRU. Returns the number of objects rebuilt."""
    for key, value in entries.items():
        if key.startswith(QUOTAS):
            state.tenants.set_quota(unquote(key[len(QUOTAS):]), json.loads(value)["quota"])
        elif key.startswith(SEGMENTS):
            record = json.loads(value)
            state.mount_segment(record["client_id"], Segment(**record["spec"]), now)
            state.clients[record["client_id"]].registered = False
    for segment, key, fields in _placed(state, entries, REPLICAS):
        report = ReportedObject(key, segment.segment_id, fields["address"], fields["size"],
                                fields["checksum"], fields["hard_pinned"])
        if state._adopt(segment.client_id, report, now):
            state.journal.replayed(report)
    for segment, key, fields in _placed(state, entries, DISK):
        state._adopt_disk(segment.client_id, ReportedObject(
            key, segment.segment_id, 0, fields["size"], fields["checksum"], fields["hard_pinned"]), now)
    for key, value in entries.items():
        if key.startswith(OFFLOADS):
            _hand_over_again(state, key[len(OFFLOADS):], json.loads(value), now)
    return len(state.objects)


def _placed(state, entries: dict[str, str], kind: str) -> list[tuple[SegmentState, str, dict]]:
    """(segment, object key, fields) of the ``kind<segment id>/<object key>`` entries whose
    segment was rebuilt; one whose segment's record was lost with a failed write has nothing to
    be placed in."""
    placed = []
    for key, value in entries.items():
        if key.startswith(kind):
            quoted, _, object_key = key[len(kind):].partition("/")
            segment = state.segments.get(unquote(quoted))
            if segment is not None:
                placed.append((segment, object_key, json.loads(value)))
    return placed


def _hand_over_again(state, key: str, source: dict, now: float) -> None:
    """Hand a victim to its owner again (it may not have heard of it before the failover), with a
    fresh deadline: the old one ran on the old leader's clock. Skipped when the replica to copy
    is gone."""
    obj = state.objects.get(key)
    if obj is None or obj.checksum != source["checksum"] or not any(
            r.in_memory and r.segment_id == source["segment_id"] and r.address == source["address"]
            for r in obj.replicas):
        return
    state.offload_pending[key] = now + state.policy.client_ttl
    state.journal.offload(source["segment_id"], key, source["address"], source["size"], source["checksum"])


def record_adopted(state, keys: list[str]) -> None:
    """Log objects a re-mounting owner reported that the log lacked (adopted, not PutEnd)."""
    for key in keys:
        obj = state.objects.get(key)
        for replica in obj.replicas if obj is not None else []:
            if replica.in_memory:
                state.journal.completed(replica.segment_id, key, replica.address, obj.size,
                                        obj.checksum, obj.hard_pinned)
