"""The master's replica copies: add replicas of a complete object on chosen segments, and move one.

A client copies an object to target segments in three steps: :meth:`copy_start` allocates one
new replica on each target that holds none yet (kept aside in ``obj.copying``: the object stays
complete and readable through its old replicas), and names the complete memory replicas to read
from; the client reads one, writes every new one, then :meth:`copy_end` publishes them all at
once (or :meth:`copy_revoke` frees them). With ``drop_segment``, ``copy_end`` also drops the
replica on that segment in the same step: a move. The object never has fewer replicas than
before, and nobody reads a replica before it is written.

The copier takes no read lease: a lease would keep its own move from dropping the source. What
makes its read safe instead is ``copy_end``'s check that every source it was given is still one
of the object's replicas: a source that was freed meanwhile (removed, evicted, unmounted, the
key overwritten) fails the copy, so bytes read from a range that may have been reused are never
published. A move still refuses (OBJECT_HAS_LEASE) to drop a replica some reader's lease may be
copying from; the copier retries once the lease has run out. A replica on a draining segment is
the exception: it is dropped, and the segment's unmount waits for the lease (store.drain.state).

Mixed into :class:`store.master_state.MasterState` (its segments, objects, journal, kv_events,
stats).
"""

from __future__ import annotations

from store.errors import (IllegalClient, InvalidParams, NoAvailableHandle, ObjectHasLease,
                          ObjectNotFound)
from store.objects import ObjectMeta, Replica, ReplicaDescriptor, ReplicaStatus
from store.tenants import shown


class Replication:
    def copy_start(self, client_id: str, key: str, segment_ids: list[str], now: float) -> dict:
        """``{"sources": [descriptor], "targets": [descriptor], "checksum"}``; targets that already
        hold a replica of ``key`` are skipped (no targets: nothing to write, end it anyway)."""
        self._touch(client_id, now)
        obj = self._complete(key)
        if not segment_ids:
            raise InvalidParams("a copy needs at least one target segment")
        unknown = [s for s in segment_ids if s not in self.segments]
        if unknown:
            raise InvalidParams(f"target segments {unknown} are not mounted")
        draining = [s for s in segment_ids if s in self.drains]
        if draining:
            raise InvalidParams(f"target segments {draining} are being drained")
        if obj.copying_owner:
            raise InvalidParams(f"{shown(key)} is being copied already")
        sources = [r for r in obj.replicas if r.in_memory]
        if not sources:
            raise InvalidParams(f"{shown(key)} has no memory replica to copy from")
        held = {r.segment_id for r in obj.replicas}
        targets = []
        for segment_id in dict.fromkeys(s for s in segment_ids if s not in held):
            segment = self.segments[segment_id]
            if not segment.allocator.can_allocate(obj.size):
                for replica in targets:
                    self._return_range(key, replica, obj.size)
                raise NoAvailableHandle(f"segment {segment_id!r} has no {obj.size} free bytes for {shown(key)}")
            targets.append(Replica(segment_id, self._take_range(segment, key, obj.size)))
        obj.copying, obj.copying_owner = targets, client_id
        obj.copy_sources = [(r.segment_id, r.address) for r in sources]
        return {"sources": self._descriptors(sources, obj.size), "targets": self._descriptors(targets, obj.size),
                "checksum": obj.checksum}

    def copy_end(self, client_id: str, key: str, now: float, drop_segment: str = "") -> None:
        """Publish the copy's replicas; with ``drop_segment``, drop the replica there too."""
        obj = self._copying(client_id, key, now)
        present = {(r.segment_id, r.address) for r in obj.replicas}
        if not all(source in present for source in obj.copy_sources):
            self._abandon_copy(obj)
            raise ObjectNotFound(f"a replica {shown(key)} was copied from went during the copy")
        if drop_segment and not any(r.segment_id != drop_segment for r in obj.replicas + obj.copying):
            raise InvalidParams(f"dropping the replica on {drop_segment!r} would leave {shown(key)} none")
        if drop_segment and obj.leased(now) and not self._drop_despite_lease(drop_segment, obj):
            raise ObjectHasLease(f"{shown(key)} is leased to a reader for {obj.lease_deadline - now:.3f}s more")
        for replica in obj.copying:
            replica.status = ReplicaStatus.COMPLETE
            self.journal.completed(replica.segment_id, key, replica.address, obj.size, obj.checksum,
                                   obj.hard_pinned)
            self.kv_events.stored(key, replica.segment_id)
        obj.replicas.extend(obj.copying)
        obj.copying, obj.copying_owner, obj.copy_sources = [], "", []
        if drop_segment:
            for replica in [r for r in obj.replicas if r.segment_id == drop_segment]:
                self._free(obj, replica)
                obj.replicas.remove(replica)
        self.stats.num_copies += 1

    def copy_revoke(self, client_id: str, key: str, now: float) -> None:
        self._abandon_copy(self._copying(client_id, key, now))

    def _abandon_copy(self, obj: ObjectMeta) -> None:
        """Free the replicas a copy of ``obj`` was writing (its copier's end then fails)."""
        for replica in obj.copying:
            if replica.segment_id in self.segments:
                self._return_range(obj.key, replica, obj.size)
        obj.copying, obj.copying_owner, obj.copy_sources = [], "", []

    def _copying(self, client_id: str, key: str, now: float) -> ObjectMeta:
        self._touch(client_id, now)
        obj = self.objects.get(key)
        if obj is None or not obj.copying_owner:
            raise ObjectNotFound(f"{shown(key)} is not being copied (removed, overwritten, or a segment went)")
        if obj.copying_owner != client_id:
            raise IllegalClient(f"{shown(key)} is being copied by another client")
        return obj

    def _descriptors(self, replicas: list[Replica], size: int) -> list[ReplicaDescriptor]:
        return [self.segments[r.segment_id].describe(r, size) for r in replicas]
