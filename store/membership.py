"""The half of the master that tracks store clients and the segments they mount.

Liveness: any call from a client proves it alive; :meth:`expire_clients` drops a client silent for
``client_ttl``, unmounts its segments (their replicas go with them) and revokes its puts in flight
and its put reservations.

Restart: a master that restarts knows no client, so it answers their pings NEED_REMOUNT; each
client calls :meth:`remount` with its segments and the complete objects they still hold, and the
master takes those objects back, so a restart loses no object whose segment is alive.

Mixed into :class:`store.master_state.MasterState`, whose state (``segments``, ``clients``,
``objects``, ``lru``, ``stats``, ``policy``, ``kv_events``) and object helpers it uses.
"""

from __future__ import annotations

from collections.abc import Iterable

from store.allocator import RangeAllocator
from store.errors import IllegalClient, InvalidParams, SegmentAlreadyExists, SegmentNotFound
from store.objects import (ClientState, ClientStatus, ObjectMeta, Replica, ReplicaStatus,
                           ReportedObject, Segment, SegmentState)
from store.tenants import tenant_of


class Membership:
    def ping(self, client_id: str, now: float) -> ClientStatus:
        """Heartbeat. NEED_REMOUNT for a client this master has not seen mount (it restarted, or
        dropped the client as silent): the client re-mounts and re-reports its objects."""
        client = self._touch(client_id, now)
        return ClientStatus.OK if client.registered else ClientStatus.NEED_REMOUNT

    def mount_segment(self, client_id: str, segment: Segment, now: float) -> None:
        client = self._touch(client_id, now)
        if self._check_segment(client_id, segment):
            return  # a retried mount
        allocator = RangeAllocator(segment.base, segment.size, self.policy.alignment)
        self.segments[segment.segment_id] = SegmentState(segment, client_id, allocator)
        client.segment_ids.append(segment.segment_id)
        client.registered = True

    def unmount_segment(self, client_id: str, segment_id: str, now: float) -> list[str]:
        """Unmount and forget every replica on the segment; returns the keys that lost their last
        replica (and so no longer exist)."""
        return self._unmount(self._owned_segment(client_id, segment_id, now))

    def _owned_segment(self, client_id: str, segment_id: str, now: float):
        """The mounted segment ``segment_id``, which ``client_id`` must own (a liveness touch)."""
        self._touch(client_id, now)
        segment = self.segments.get(segment_id)
        if segment is None:
            raise SegmentNotFound(f"segment {segment_id!r} is not mounted")
        if segment.client_id != client_id:
            raise IllegalClient(f"segment {segment_id!r} belongs to another client")
        return segment

    def remount(self, client_id: str, segments: Iterable[Segment], objects: Iterable[ReportedObject],
                now: float, disk_objects: Iterable[ReportedObject] = ()) -> dict[str, list[str]]:
        """Make the master's view of this client match what the client reports.

        Segments it no longer reports are unmounted; reported ones are mounted (a retried mount is
        a no-op). Each reported complete object is taken back unless the master already holds a
        different object under that key (other size or checksum), or its range is not free: those
        are returned as ``rejected`` and the client must forget them, which keeps a stale copy
        from ever being served in place of a newer one.

        ``disk_objects`` are the files of the client's SSD tier (checked against their header and
        checksum by the client): each becomes a DISK replica again (see ``_adopt_disk``), so an
        object held only on disk outlives a master restart too; refused ones come back as
        ``disk_rejected`` and the client deletes their files.
        """
        segments = list(segments)
        # Check everything first: a refused remount changes nothing.
        kept = {s.segment_id for s in segments if self._check_segment(client_id, s, allow_replace=True)}
        client = self._touch(client_id, now)
        for segment_id in [sid for sid in client.segment_ids if sid not in kept]:
            self._unmount(self.segments[segment_id])
        for segment in segments:
            self.mount_segment(client_id, segment, now)
        client.registered = True
        accepted, rejected = [], []
        for report in objects:
            (accepted if self._adopt(client_id, report, now) else rejected).append(report.key)
        disk_rejected = [r.key for r in disk_objects if not self._adopt_disk(client_id, r, now)]
        return {"accepted": accepted, "rejected": rejected, "disk_rejected": disk_rejected}

    def expire_clients(self, now: float) -> list[str]:
        """Drop every client silent for ``client_ttl``: unmount its segments (their replicas go)
        and revoke the puts it left in flight and its reservations. Returns the dropped client ids."""
        expired = [c for c in self.clients.values() if now - c.last_seen >= self.policy.client_ttl]
        for client in expired:
            for segment_id in list(client.segment_ids):
                self._unmount(self.segments[segment_id])
            for obj in [o for o in self.objects.values() if o.owner == client.client_id and not o.complete]:
                self._drop(obj)
                self.stats.num_put_revokes += 1
            for obj in [o for o in self.objects.values() if o.copying_owner == client.client_id]:
                self._abandon_copy(obj)
            self._release_reservations_of(client.client_id)
            del self.clients[client.client_id]
            self.stats.num_expired_clients += 1
        return [c.client_id for c in expired]

    def _touch(self, client_id: str, now: float) -> ClientState:
        """Any call from a client proves it alive; a client first met here is not registered."""
        if not isinstance(client_id, str) or not client_id:
            raise InvalidParams("client_id must be a non-empty string")
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = ClientState(client_id, now)
        client.last_seen = max(client.last_seen, now)
        return client

    def _check_segment(self, client_id: str, segment: Segment, allow_replace: bool = False) -> bool:
        """Validate a mount; True when exactly this segment is already mounted by this client.
        With ``allow_replace`` this client's own segment under another geometry may be replaced."""
        if not isinstance(segment.segment_id, str) or not segment.segment_id or not segment.name:
            raise InvalidParams("a segment needs a non-empty segment_id and name")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (segment.base, segment.size)) \
                or segment.base < 0 or segment.size < self.policy.alignment:
            raise InvalidParams(f"segment {segment.segment_id!r} needs base >= 0 and size >= "
                                f"{self.policy.alignment}, got base={segment.base!r} size={segment.size!r}")
        existing = self.segments.get(segment.segment_id)
        if existing is None:
            return False
        if existing.client_id == client_id and (existing.spec == segment or allow_replace):
            return existing.spec == segment
        raise SegmentAlreadyExists(f"segment {segment.segment_id!r} is already mounted")

    def _well_formed_report(self, client_id: str, report: ReportedObject) -> bool:
        """A re-reported replica names a segment this client owns, a valid key and a valid size."""
        segment = self.segments.get(report.segment_id)
        if segment is None or segment.client_id != client_id:
            return False
        try:
            self._check_key(report.key)
            self._check_size(report.size)
        except InvalidParams:
            return False
        return True

    def _adopt(self, client_id: str, report: ReportedObject, now: float) -> bool:
        """Take back one re-reported replica; False (rejected) when it cannot be trusted or placed."""
        if not self._well_formed_report(client_id, report):
            return False
        if isinstance(report.address, bool) or not isinstance(report.address, int):
            return False
        obj = self.objects.get(report.key)
        if obj is not None:
            if any(r.segment_id == report.segment_id and r.address == report.address for r in obj.replicas):
                return obj.complete and obj.size == report.size  # the master never forgot it
            same = obj.complete and obj.size == report.size and obj.checksum == report.checksum
            if not same or any(r.segment_id == report.segment_id for r in obj.replicas):
                return False
        try:
            self.segments[report.segment_id].allocator.reserve(report.address, report.size)
        except InvalidParams:
            return False
        self.tenants.charge(tenant_of(report.key), report.size)
        replica = Replica(report.segment_id, report.address, ReplicaStatus.COMPLETE)
        if obj is None:
            obj = self.objects[report.key] = ObjectMeta(
                report.key, report.size, client_id, [replica], now, hard_pinned=report.hard_pinned,
                last_access=now, checksum=report.checksum)
            self.lru[report.key] = None
        else:
            obj.replicas.append(replica)
        self.kv_events.stored(report.key, report.segment_id)
        self.stats.num_adopted += 1
        return True

    def _unmount(self, segment: SegmentState) -> list[str]:
        lost = []
        # A dead client's disk replicas go with its segment, like its memory ones.
        for obj in [o for o in self.objects.values() if any(r.segment_id == segment.segment_id for r in o.replicas)]:
            if obj.complete and any(r.in_memory and r.segment_id == segment.segment_id for r in obj.replicas):
                self.kv_events.removed(obj.key, segment.segment_id)
            held_here = sum(r.in_memory and r.segment_id == segment.segment_id for r in obj.replicas)
            self.tenants.release(tenant_of(obj.key), obj.size * held_here)  # the ranges go with the segment
            obj.replicas = [r for r in obj.replicas if r.segment_id != segment.segment_id]
            if not obj.replicas:
                # Ranges it held elsewhere (a promotion, a copy's targets) are freed with it.
                self._abandon_copy(obj)
                if obj.promoting is not None:
                    if obj.promoting.segment_id == segment.segment_id:
                        self.tenants.release(tenant_of(obj.key), obj.size)
                    else:
                        self._return_range(obj.key, obj.promoting, obj.size)
                    obj.promoting = None
                del self.objects[obj.key]
                self.lru.pop(obj.key, None)
                self.offload_pending.pop(obj.key, None)
                lost.append(obj.key)
            elif not any(r.in_memory for r in obj.replicas):
                self.lru.pop(obj.key, None)  # left only on disk elsewhere: nothing to evict
        for obj in self.objects.values():
            if obj.promoting is not None and obj.promoting.segment_id == segment.segment_id:
                self.tenants.release(tenant_of(obj.key), obj.size)
                obj.promoting = None
            if any(r.segment_id == segment.segment_id for r in obj.copying):
                self._abandon_copy(obj)  # a copy that cannot complete: free its other targets
        self._forget_reservations_on(segment.segment_id)
        del self.segments[segment.segment_id]
        self.quarantine.forget_segment(segment.segment_id)
        self.journal.forget(segment.segment_id)
        client = self.clients.get(segment.client_id)
        if client is not None:
            client.segment_ids.remove(segment.segment_id)
        self.stats.num_objects_lost += len(lost)
        return lost
