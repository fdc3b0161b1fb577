"""The master's half of a drain: which segments are draining, what is left on them, when one goes.

Lifecycle of the drain of a segment S (at most one per segment; ``drainer`` is the client that
runs it and moves the bytes)::

    drain_start ──► DRAINING ──drain_finish──► FINISHING ──S's owner unmounts it──► gone
                       │
                       └──drain_cancel, or the drainer expired──► CANCELLED ──leases out──► gone

From drain_start on, S takes no new replica: puts, promotions, eviction for room and copies
pass it by, and an upsert of an object held there allocates it anew elsewhere. drain_start
refuses, changing nothing, when the objects held only on S cannot fit in the other segments'
free bytes. The drainer moves each object held only on S with :meth:`drain_move_start` (a copy
to a segment placement picks) and ``copy_end(drop_segment=S)``. :meth:`drain_finish` then drops
S's replicas of the objects held elsewhere too, and the owner learns from its next ping answer
(``unmount``) that it may unmount S, which it does itself: only an owner unmounts.

Leases: a replica on a draining segment may be dropped while its object is leased, which
anywhere else is refused. What the lease protects is the reader's copy from that range, and the
range cannot be reused: nothing is allocated on S again. The memory itself goes only with the
unmount, which waits until every lease on an object whose S replica was dropped has run out
(``quiet_after``). So a storm of reads cannot hold a drain up, and no reader ever copies from
memory that was handed to another object. A cancelled drain keeps S closed to new replicas
until ``quiet_after`` too, then S serves puts again, keeping what the drain already moved away.

The drain state is not in the HA op log: a master that restarts (or a new leader) knows no
drain, S takes replicas again, and the drainer's next call fails; running it again resumes.

Mixed into :class:`store.master_state.MasterState` (its segments, clients, objects, policy and
helpers); :meth:`expire_drains` runs on the daemon's tick.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from store.drain.messages import DrainFinish, DrainPending, DrainPlan, DrainStatus
from store.errors import IllegalClient, InvalidParams, NoAvailableHandle, ObjectNotFound, SegmentNotFound
from store.objects import ObjectMeta, SegmentState
from store.placement import placement_order


class DrainPhase(str, enum.Enum):
    DRAINING = "draining"
    FINISHING = "finishing"
    CANCELLED = "cancelled"


@dataclass
class Drain:
    segment_id: str
    drainer: str
    phase: DrainPhase = DrainPhase.DRAINING
    # Every lease on an object whose replica here was dropped runs out by then: only after it
    # may the segment's memory go (unmount) or its ranges be reused (after a cancel).
    quiet_after: float = 0.0


@dataclass
class _Census:
    """The objects with a replica on one segment, by what a drain must do with them."""

    only_here: list[ObjectMeta]
    elsewhere: list[ObjectMeta]
    in_flight: list[ObjectMeta]
    disk_only: list[ObjectMeta]


class Draining:
    def drain_start(self, client_id: str, segment_id: str, now: float) -> DrainPlan:
        """Close ``segment_id`` to new replicas and say what there is to move. Starting again
        by the same drainer resumes; another client may take over only a drain whose drainer
        cancelled or died."""
        self._touch(client_id, now)
        self._mounted(segment_id)
        drain = self.drains.get(segment_id)
        if drain is not None and drain.phase is DrainPhase.FINISHING:
            raise InvalidParams(f"segment {segment_id!r} is drained already; its owner unmounts it")
        if drain is not None and drain.phase is DrainPhase.DRAINING and drain.drainer != client_id \
                and drain.drainer in self.clients:
            raise InvalidParams(f"segment {segment_id!r} is being drained by {drain.drainer} (a drain "
                                "whose drainer stops calling is cancelled after the client TTL)")
        census = self._census(segment_id)
        plan = self._plan(segment_id, census)
        if census.disk_only:
            raise InvalidParams(f"{len(census.disk_only)} objects are held only on the SSD tier of segment "
                                f"{segment_id!r}, which a drain does not move (e.g. {census.disk_only[0].key!r})")
        self._check_room(segment_id, census.only_here, plan.free_elsewhere)
        quiet_after = drain.quiet_after if drain is not None else 0.0
        self.drains[segment_id] = Drain(segment_id, client_id, DrainPhase.DRAINING, quiet_after)
        self._release_reservations_on(segment_id)  # closed to new objects: commits into it fail
        return plan

    def drain_pending(self, client_id: str, segment_id: str, now: float, limit: int,
                      skip: list[str] = ()) -> DrainPending:
        """Up to ``limit`` keys of each kind still on the segment; ``skip``: keys the drainer
        gave up on, left out so that the page holds others."""
        self._drain_of(client_id, segment_id, now)
        census = self._census(segment_id)
        skipped = set(skip)
        to_move = [o.key for o in census.only_here if o.key not in skipped][:limit]
        return DrainPending(to_move, [o.key for o in census.in_flight[:limit]],
                            [o.key for o in census.disk_only[:limit]], len(census.only_here))

    def drain_move_start(self, client_id: str, segment_id: str, key: str, now: float) -> dict:
        """copy_start of ``key`` to one segment that placement picks among those open to new
        replicas; the drainer ends it with copy_end(drop_segment=segment_id)."""
        self._drain_of(client_id, segment_id, now)
        obj = self._complete(key)
        held = {r.segment_id for r in obj.replicas}
        if segment_id not in held:
            raise ObjectNotFound(f"{key!r} is no longer on segment {segment_id!r}")
        candidates = [s for s in self._open_segments() if s.segment_id not in held]
        order = placement_order(self.policy.allocation_strategy, candidates, (), lambda s: False, self._rng)
        target = next((s for s in order if s.allocator.can_allocate(obj.size)), None)
        if target is None:
            raise NoAvailableHandle(f"no other segment has {obj.size} free bytes for {key!r}")
        return self.copy_start(client_id, key, [target.segment_id], now)

    def drain_finish(self, client_id: str, segment_id: str, now: float) -> DrainFinish:
        """Drop the segment's replicas of objects held elsewhere too; refused while any object
        is still held only there or being written there. The owner is then told to unmount."""
        drain = self._drain_of(client_id, segment_id, now)
        census = self._census(segment_id)
        left = census.only_here + census.in_flight + census.disk_only
        if left:
            raise InvalidParams(f"segment {segment_id!r} still holds {len(left)} objects found nowhere else "
                                f"(e.g. {left[0].key!r})")
        for obj in census.elsewhere:
            self._drop_replicas_on(drain, obj, now)
        for obj in self.objects.values():
            if obj.promoting is not None and obj.promoting.segment_id == segment_id:
                self._return_range(obj.key, obj.promoting, obj.size)
                obj.promoting = None  # its promote_end now fails: it was best effort
            if any(r.segment_id == segment_id for r in obj.copying):
                self._abandon_copy(obj)
        drain.phase = DrainPhase.FINISHING
        return DrainFinish(len(census.elsewhere), max(0.0, drain.quiet_after - now))

    def drain_cancel(self, client_id: str, segment_id: str, now: float) -> None:
        """Stop draining: the segment stays mounted and serving, and takes new replicas again
        once the leases on what the drain dropped there have run out."""
        self._touch(client_id, now)
        drain = self.drains.get(segment_id)
        if drain is None or drain.phase is DrainPhase.CANCELLED:
            return  # a retried cancel
        if drain.drainer != client_id and drain.drainer in self.clients:
            raise IllegalClient(f"segment {segment_id!r} is being drained by {drain.drainer}")
        if drain.phase is DrainPhase.FINISHING:
            raise InvalidParams(f"segment {segment_id!r} is drained already; its owner unmounts it")
        drain.phase = DrainPhase.CANCELLED

    def drain_status(self, client_id: str, segment_id: str, now: float) -> DrainStatus:
        self._touch(client_id, now)
        if segment_id not in self.segments:
            return DrainStatus(segment_id, "unmounted", "", 0.0)
        drain = self.drains.get(segment_id)
        if drain is None:
            return DrainStatus(segment_id, "none", "", 0.0)
        return DrainStatus(segment_id, drain.phase.value, drain.drainer, max(0.0, drain.quiet_after - now))

    def segments_to_unmount(self, client_id: str, now: float) -> list[str]:
        """The segments of ``client_id`` drained and quiet: the ping answer tells it to unmount them."""
        client = self.clients.get(client_id)
        if client is None:
            return []
        return [sid for sid in client.segment_ids
                if (d := self.drains.get(sid)) is not None and d.phase is DrainPhase.FINISHING
                and now >= d.quiet_after]

    def expire_drains(self, now: float) -> None:
        """On the tick: forget drains whose segment went; cancel those whose drainer expired
        (the segment serves again); forget cancelled ones once their leases ran out."""
        for segment_id, drain in list(self.drains.items()):
            if segment_id not in self.segments:
                del self.drains[segment_id]
                continue
            if drain.phase is DrainPhase.DRAINING and drain.drainer not in self.clients:
                drain.phase = DrainPhase.CANCELLED
            if drain.phase is DrainPhase.CANCELLED and now >= drain.quiet_after:
                del self.drains[segment_id]

    # == what the rest of the master asks ======================================================
    def _open_segments(self) -> list[SegmentState]:
        """The segments that may take new replicas, in mount order: all but draining ones."""
        return [s for s in self.segments.values() if s.segment_id not in self.drains]

    def _drop_despite_lease(self, segment_id: str, obj: ObjectMeta) -> bool:
        """Whether a replica of leased ``obj`` on ``segment_id`` may be dropped now: yes on a
        draining segment, whose unmount then waits for this lease (see the module's docstring)."""
        drain = self.drains.get(segment_id)
        if drain is None:
            return False
        drain.quiet_after = max(drain.quiet_after, obj.lease_deadline)
        return True

    # == helpers ================================================================================
    def _mounted(self, segment_id: str) -> SegmentState:
        segment = self.segments.get(segment_id)
        if segment is None:
            mounted = ", ".join(self.segments) or "none"
            raise SegmentNotFound(f"segment {segment_id!r} is not mounted (mounted: {mounted})")
        return segment

    def _drain_of(self, client_id: str, segment_id: str, now: float) -> Drain:
        """The running drain of ``segment_id``, which ``client_id`` must be running (a touch)."""
        self._touch(client_id, now)
        self._mounted(segment_id)
        drain = self.drains.get(segment_id)
        if drain is None:
            raise InvalidParams(f"segment {segment_id!r} is not being drained")
        if drain.phase is not DrainPhase.DRAINING:
            raise InvalidParams(f"the drain of segment {segment_id!r} is {drain.phase.value}")
        if drain.drainer != client_id:
            raise IllegalClient(f"segment {segment_id!r} is being drained by {drain.drainer}")
        return drain

    def _census(self, segment_id: str) -> _Census:
        census = _Census([], [], [], [])
        for obj in self.objects.values():
            if not any(r.segment_id == segment_id for r in obj.replicas):
                continue
            if not obj.complete:
                census.in_flight.append(obj)
            elif any(r.segment_id != segment_id for r in obj.replicas):
                census.elsewhere.append(obj)
            elif any(r.in_memory for r in obj.replicas):
                census.only_here.append(obj)
            else:
                census.disk_only.append(obj)
        return census

    def _plan(self, segment_id: str, census: _Census) -> DrainPlan:
        free = sum(s.allocator.num_free_bytes for s in self._open_segments() if s.segment_id != segment_id)
        return DrainPlan(segment_id, len(census.only_here), sum(o.size for o in census.only_here),
                         len(census.elsewhere), len(census.in_flight), len(census.disk_only), free)

    def _check_room(self, segment_id: str, only_here: list[ObjectMeta], free: int) -> None:
        """NoAvailableHandle, before anything moves, when the objects held only on the segment
        cannot fit in the others' free bytes (in total, or the largest in the largest range).
        The others do not evict for a drain: that would lose objects to keep others."""
        if not only_here:
            return
        others = [s for s in self._open_segments() if s.segment_id != segment_id]
        if not others:
            raise NoAvailableHandle(f"no other segment can take the {len(only_here)} objects held only on "
                                    f"segment {segment_id!r}")
        allocator = others[0].allocator  # one alignment policy: any allocator rounds sizes alike
        need = sum(allocator.block_size(o.size) for o in only_here)
        largest = max(allocator.block_size(o.size) for o in only_here)
        widest = max(s.allocator.largest_free_range for s in others)
        if need > free or largest > widest:
            raise NoAvailableHandle(
                f"not enough room elsewhere to drain segment {segment_id!r}: {len(only_here)} objects "
                f"({need} bytes) are held only there, the other segments have {free} bytes free "
                f"(largest free range {widest}, largest object {largest})")

    def _drop_replicas_on(self, drain: Drain, obj: ObjectMeta, now: float) -> None:
        """Drop ``obj``'s replicas on the drained segment (it has others)."""
        if obj.leased(now):
            drain.quiet_after = max(drain.quiet_after, obj.lease_deadline)
        for replica in [r for r in obj.replicas if r.segment_id == drain.segment_id]:
            self._free(obj, replica)
            obj.replicas.remove(replica)
        if not any(r.in_memory for r in obj.replicas):
            self.lru.pop(obj.key, None)  # left only on disk elsewhere: nothing to evict
