"""The master's SSD tier: disk replicas that segment owners report, and promotion back to memory.

A store client with ``offload_dir`` writes objects of its segment to local files and reports
them here: the object gains a DISK replica on that segment. Which objects: with
``offload_policy`` "all", each as it completes (the owner learns of them from its ping changes);
with "evicted", the eviction victims the master hands it ("offload" changes, see
``MasterState._hand_over``), whose memory is freed here once their copy is reported. Eviction then frees only the memory replicas of such an object; it stays
readable from disk (through the owner) and leaves the LRU, which orders memory only. A disk
replica goes with its segment: a dead or unmounted owner takes its files' replicas along.

Promotion: once ``PROMOTE_AFTER_DISK_READS`` leases were granted on an object held only on
disk, the replica list says ``promote``; that reader, after its disk read, asks
:meth:`promote_start` for one memory replica, writes it and calls :meth:`promote_end`. The
object stays complete and readable from disk meanwhile (the new replica is kept aside until it
is complete).

Mixed into :class:`store.master_state.MasterState` (its segments, objects, lru, journal, stats).
"""

from __future__ import annotations

from store.errors import (IllegalClient, InvalidParams, NoAvailableHandle, ObjectNotFound,
                          ReplicaIsNotReady)
from store.objects import (ObjectMeta, Replica, ReplicaDescriptor, ReplicaStatus, ReplicaTier,
                           ReportedObject)
from store.placement import placement_order
from store.tenants import shown

PROMOTE_AFTER_DISK_READS = 2


class Tiering:
    def add_disk_replica(self, client_id: str, key: str, segment_id: str, address: int,
                         checksum: int | None, now: float) -> None:
        """Record that the owner of ``segment_id`` wrote ``key`` to disk from its memory replica
        at ``address`` with ``checksum``. Refused unless that replica still holds that object
        (it may have been evicted and the range reused before the owner copied it)."""
        self._owned_segment(client_id, segment_id, now)
        obj = self._complete(key)
        if checksum is None or obj.checksum != checksum or not any(
                r.in_memory and r.segment_id == segment_id and r.address == address for r in obj.replicas):
            raise InvalidParams(f"{shown(key)} no longer is the object at {address:#x} of {segment_id!r}")
        if any(not r.in_memory and r.segment_id == segment_id for r in obj.replicas):
            return  # a retried report
        obj.replicas.append(Replica(segment_id, 0, ReplicaStatus.COMPLETE, ReplicaTier.DISK))
        self.journal.disk_added(segment_id, key, obj.size, checksum, obj.hard_pinned)
        self.stats.num_offloaded += 1
        if key in self.offload_pending:
            self._evict([obj])  # the victim handed over for this copy: now it can go

    def _adopt_disk(self, client_id: str, report: ReportedObject, now: float) -> bool:
        """Take back one re-reported disk replica (the owner checked its file); False (rejected)
        when it cannot be trusted: the master holds another object under that key."""
        if report.checksum is None or not self._well_formed_report(client_id, report):
            return False
        obj = self.objects.get(report.key)
        if obj is None:
            # Only on disk: out of the LRU, which orders memory, like any evicted object.
            obj = self.objects[report.key] = ObjectMeta(
                report.key, report.size, client_id, [], now, hard_pinned=report.hard_pinned,
                last_access=now, checksum=report.checksum)
        elif not (obj.complete and obj.size == report.size and obj.checksum == report.checksum):
            return False
        # One the master already holds (it never forgot it, or replayed it) is not logged again.
        if not any(not r.in_memory and r.segment_id == report.segment_id for r in obj.replicas):
            obj.replicas.append(Replica(report.segment_id, 0, ReplicaStatus.COMPLETE, ReplicaTier.DISK))
            self.journal.disk_added(report.segment_id, report.key, obj.size, obj.checksum, obj.hard_pinned)
        self.stats.num_adopted += 1
        return True

    def promote_start(self, client_id: str, key: str, now: float, host: str = "") -> ReplicaDescriptor:
        """One new memory replica for an object held only on disk (best effort: no eviction)."""
        self._touch(client_id, now)
        obj = self._complete(key)
        if obj.promoting is not None or any(r.in_memory for r in obj.replicas):
            raise InvalidParams(f"{shown(key)} is already in memory or being promoted")
        order = placement_order(self.policy.allocation_strategy, self._open_segments(), (),
                                lambda s: s.client_id == client_id or bool(host and s.spec.host == host),
                                self._rng)
        for segment in order:
            if segment.allocator.can_allocate(obj.size):
                obj.promoting = Replica(segment.segment_id, self._take_range(segment, key, obj.size))
                obj.promoting_owner = client_id
                return segment.describe(obj.promoting, obj.size)
        raise NoAvailableHandle(f"no segment has {obj.size} free bytes to promote {shown(key)}")

    def promote_end(self, client_id: str, key: str, now: float) -> None:
        obj = self._promoting(client_id, key, now)
        replica, obj.promoting = obj.promoting, None
        replica.status = ReplicaStatus.COMPLETE
        obj.replicas.insert(0, replica)
        obj.disk_reads = 0
        self.journal.completed(replica.segment_id, key, replica.address, obj.size, obj.checksum,
                               obj.hard_pinned)
        self.kv_events.stored(key, replica.segment_id)
        self.lru[key] = None
        self.stats.num_promoted += 1
        self.stats.num_promoted_bytes += obj.size

    def promote_revoke(self, client_id: str, key: str, now: float) -> None:
        obj = self._promoting(client_id, key, now)
        self._return_range(key, obj.promoting, obj.size)
        obj.promoting = None

    def _complete(self, key: str) -> ObjectMeta:
        obj = self.objects.get(key)
        if obj is None:
            raise ObjectNotFound(f"no object {shown(key)}")
        if not obj.complete:
            raise ReplicaIsNotReady(f"{shown(key)} is still being written")
        return obj

    def _promoting(self, client_id: str, key: str, now: float) -> ObjectMeta:
        self._touch(client_id, now)
        obj = self.objects.get(key)
        if obj is None or obj.promoting is None:
            raise ObjectNotFound(f"{shown(key)} is not being promoted (removed, or its segment went)")
        if obj.promoting_owner != client_id:
            raise IllegalClient(f"{shown(key)} is being promoted by another client")
        return obj
