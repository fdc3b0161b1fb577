"""What each segment's owner must learn so it can re-report its objects after a master restart.

Objects are written into a segment by *other* clients; the owner never sees their puts. So the
master keeps, per segment, the changes to its complete objects (completed, gone) that the owner
has not acknowledged yet, and hands them out with the answer to the owner's ping. The owner
applies them to its own record and acknowledges with the last sequence number it applied, which
trims the log. After a restart the owner re-reports its record through ``remount``.

Known gap: an object that completed after the owner's last ping is not yet in its record, so a
master that dies within one ping interval of a PutEnd forgets that object (the bytes are intact;
a writer that retries puts it again).

Pure: the master state machine calls :meth:`completed` and :meth:`gone`; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from store.objects import tuple_of


class SegmentChange(NamedTuple):
    """A named tuple: one is made per replica of every PutEnd, where a dataclass cost more. It
    travels as it is, a msgpack array of its fields in order: a ping's answer carries one per
    object put or removed since the last, all built under the store lock."""

    seq: int
    # "complete" | "gone" (a memory replica) | "disk_gone" (the file may go) | "offload" (copy
    # this evicted object to disk now: the master frees its memory once the copy is reported)
    kind: str
    key: str
    address: int
    size: int = 0
    checksum: int | None = None
    hard_pinned: bool = False


# (segment_id, key, address, size, checksum, hard_pinned) of a replica that completed
Completion = tuple[str, str, int, int, "int | None", bool]


@dataclass
class _Log:
    next_seq: int = 1
    changes: list[SegmentChange] = field(default_factory=list)


class SegmentJournal:
    def __init__(self) -> None:
        self._logs: dict[str, _Log] = {}

    def completed(self, segment_id: str, key: str, address: int, size: int,
                  checksum: int | None, hard_pinned: bool) -> None:
        self._append(segment_id, "complete", key, address, size, checksum, hard_pinned)

    def completed_many(self, completions: list[Completion]) -> None:
        """:meth:`completed` for each replica, in order: a batch PutEnd's, appended in one pass
        (two calls per replica were a good part of a small object's PutEnd under the store lock)."""
        logs = self._logs
        for segment_id, key, address, size, checksum, hard_pinned in completions:
            log = logs.get(segment_id)
            if log is None:
                log = logs[segment_id] = _Log()
            seq = log.next_seq
            log.changes.append(tuple_of(SegmentChange, (seq, "complete", key, address, size, checksum, hard_pinned)))
            log.next_seq = seq + 1

    def gone(self, segment_id: str, key: str, address: int) -> None:
        self._append(segment_id, "gone", key, address)

    def offload(self, segment_id: str, key: str, address: int, size: int, checksum: int) -> None:
        self._append(segment_id, "offload", key, address, size, checksum)

    def disk_gone(self, segment_id: str, key: str) -> None:
        self._append(segment_id, "disk_gone", key, 0)

    def disk_added(self, segment_id: str, key: str, size: int, checksum: int,
                   hard_pinned: bool) -> None:
        """The owner wrote (or re-reported) this file itself: it needs no news. A hook for the
        op log (:class:`store.oplog.OpLogJournal`), which must record it."""

    def quota_set(self, tenant: str, quota: int) -> None:
        """A tenant's quota was set at run time: no owner needs to hear of it. A hook for the op
        log (:class:`store.oplog.OpLogJournal`), which must record it."""

    def forget(self, segment_id: str) -> None:
        """The segment was unmounted: its owner will not ask again."""
        self._logs.pop(segment_id, None)

    def since(self, segment_id: str, acknowledged: int) -> list[SegmentChange]:
        """Drop what the owner acknowledged; return the rest, oldest first."""
        log = self._logs.get(segment_id)
        if log is None:
            return []
        changes = log.changes
        if changes:
            # Their sequence numbers run without a gap (only a prefix is ever dropped), so the
            # acknowledged ones are a prefix of known length: no pass over every change each ping.
            del changes[:max(0, acknowledged - changes[0].seq + 1)]
        return list(changes)

    def _append(self, segment_id: str, kind: str, key: str, address: int, size: int = 0,
                checksum: int | None = None, hard_pinned: bool = False) -> None:
        log = self._logs.get(segment_id)
        if log is None:  # not setdefault: that would build a _Log on every change
            log = self._logs[segment_id] = _Log()
        log.changes.append(tuple_of(SegmentChange, (log.next_seq, kind, key, address, size, checksum, hard_pinned)))
        log.next_seq += 1
