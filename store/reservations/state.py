"""The master's half of put reservations (see the package's docstring).

A reservation is a range allocated like any put's, owned by one client and tied to no key: it
counts as used, is never evicted or read, and goes when its client commits into it, releases it,
goes silent, or lets it sit for ``put_start_discard_timeout`` (as an abandoned PutStart would);
when its segment is unmounted or starts draining it is dropped, and a commit into it fails as a
whole with ObjectNotFound, upon which the client puts the same objects the plain way.

A commit turns the pieces the client wrote into objects exactly as a PutStart and PutEnd of each
would (the same checks, preemption of abandoned puts, journal entries, KV events and counters),
frees whatever of the range it did not use, and may grant the next reservation in the same call.

Only for what a reservation cannot change the meaning of: one replica, no tenant quota anywhere
(a quota may need eviction per key, which PutStart does), at most ``MAX_RESERVATION_BYTES``, and
not for upserts (the client's choice). Anything else is answered with no grant, and the client
uses PutStart.

Mixed into :class:`store.master_state.MasterState`, whose segments, objects, allocator and
helpers it uses. Pure: no I/O, times are the caller's ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import InvalidParams, MooncakeError, ObjectNotFound
from store.objects import ObjectMeta, Replica, ReplicaStatus, ReplicateConfig
from store.reservations.messages import SpaceGrant
from store.segment_journal import Completion
from store.tenants import tenant_of

# A reservation only pays off where a round trip is a good part of a put: small objects. Bigger
# asks get no grant, so an idle client never holds much of a segment.
MAX_RESERVATION_BYTES = 2 << 20
_COMPLETE = ReplicaStatus.COMPLETE
# Reservations one client may hold at once (one per thread that puts, in practice).
MAX_PER_CLIENT = 16


@dataclass(slots=True)
class Reservation:
    reservation_id: int
    client_id: str
    segment_id: str
    address: int
    length: int
    granted_at: float
    config: ReplicateConfig  # the grant's: what a commit that names none puts with

    def advance(self, consumed: int) -> None:
        """Its first ``consumed`` bytes became objects (or were freed): it starts after them."""
        self.address += consumed
        self.length -= consumed


class Reservations:
    def reserve_space(self, client_id: str, length: int, now: float, config: ReplicateConfig,
                      release: list[int] = ()) -> SpaceGrant | None:
        """Release ``release`` (this client's reservations it will not use), then grant a new one
        of ``length`` bytes placed as a put with ``config`` would be, or None where reservations
        do not apply or no segment has room without evicting (a put then evicts as it must).
        ``length`` 0 only releases."""
        self._touch(client_id, now)
        self._release_own(client_id, release)
        return self._grant(client_id, length, now, config)

    def batch_put_commit(self, client_id: str, reservation_id: int, keys: list[str], offsets: list[int],
                         sizes: list[int], checksums: list[int | None], now: float, config: ReplicateConfig | None,
                         consumed: int | None = None, reserve: int = 0,
                         release: list[int] = ()) -> tuple[list[None | MooncakeError], SpaceGrant | None]:
        """Publish ``keys``, written at ``offsets`` (ascending, aligned, from the reservation's
        start) with ``sizes`` bytes and ``checksums``; per key None or its error (the range of a
        key that failed is freed). With ``consumed``, the reservation from that offset on stays
        the client's, for its next commit (its start moves there); without, or with ``reserve``
        > 0, the rest is freed, and ``reserve`` bytes are granted anew. ObjectNotFound for the
        whole call when the reservation is gone. ``release``: as for :meth:`reserve_space`.
        ``config`` None: the one the reservation was granted with (a client commits with the
        config it asked the grant for, so it need not send it again, nor the master parse it:
        4-5 us of a small put's commit)."""
        self._check_batch(keys, offsets)
        self._check_batch(keys, sizes)
        self._check_batch(keys, checksums)
        self._touch(client_id, now)
        self._release_own(client_id, release)
        reservation = self.reservations.get(reservation_id)
        if reservation is None or reservation.client_id != client_id:
            raise ObjectNotFound(f"reservation {reservation_id!r} is gone (expired, released, or its "
                                 "segment left): put these objects again")
        if self.tenants.quotas or self.tenants.default_quota:
            # A quota was set since the grant: each key may have to evict for it, as PutStart does.
            self._release_reservation(reservation)
            raise ObjectNotFound(f"reservation {reservation_id!r} was released when a tenant quota was set: "
                                 "put these objects again")
        if config is None:
            config = reservation.config
        keep_from = None if reserve > 0 or consumed is None or consumed == reservation.length else consumed
        segment = self.segments[reservation.segment_id]
        try:
            addresses = segment.allocator.carve(reservation.address, list(zip(offsets, sizes)), keep_from)
        except InvalidParams:
            self._release_reservation(reservation)
            raise
        if keep_from is None:
            del self.reservations[reservation_id]
        else:
            reservation.advance(keep_from)
        # The objects are born complete: PutStart's and PutEnd's work per key in one pass, with
        # what they count added up once. The master's time is most of a small batch put's round
        # trip: reserve + commit of 32 objects 157-162 -> 124-130 us (/tmp/mb/commit.py).
        results: list[None | MooncakeError] = self._key_errors(keys)
        completions: list[Completion] = []
        stored: list[tuple[str, str]] = []
        charged: dict[str, int] = {}
        objects, lru, segment_id = self.objects, self.lru, reservation.segment_id
        hard_pinned, soft_pin_ttl = config.hard_pin, self._soft_pin_ttl(config)
        soft_pin_deadline = None if soft_pin_ttl is None else now + soft_pin_ttl  # from completion
        for n, (key, address, size, checksum) in enumerate(zip(keys, addresses, sizes, checksums)):
            if results[n] is None and key in objects:
                try:
                    self._preempt_or_refuse(objects[key], now)  # as PutStart: refused unless abandoned
                except MooncakeError as exc:
                    results[n] = exc
            if results[n] is not None:
                segment.allocator.free(address)
                continue
            objects[key] = ObjectMeta(key, size, client_id, [Replica(segment_id, address, _COMPLETE)], now,
                                      hard_pinned, soft_pin_ttl, soft_pin_deadline, 0.0, now, checksum)
            lru[key] = None
            completions.append((segment_id, key, address, size, checksum, hard_pinned))
            stored.append((key, segment_id))
            tenant = tenant_of(key)
            charged[tenant] = charged.get(tenant, 0) + size
        for tenant, num_bytes in charged.items():
            self.tenants.charge(tenant, num_bytes)
        self.stats.num_put_starts += len(completions)
        self.stats.num_put_ends += len(completions)
        self.journal.completed_many(completions)
        self.kv_events.stored_many(stored)
        return results, (self._grant(client_id, reserve, now, config) if reserve > 0 else None)

    def expire_reservations(self, now: float) -> None:
        """Free the reservations granted ``put_start_discard_timeout`` or longer ago."""
        timeout = self.policy.put_start_discard_timeout
        for reservation in [r for r in self.reservations.values() if now - r.granted_at >= timeout]:
            self._release_reservation(reservation)

    def _grant(self, client_id: str, length: int, now: float, config: ReplicateConfig) -> SpaceGrant | None:
        self._check_config(config)
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise InvalidParams(f"a reservation needs a length >= 0, got {length!r}")
        if length == 0:  # a call that only releases
            return None
        if config.replica_num != 1 or length > MAX_RESERVATION_BYTES \
                or self.tenants.quotas or self.tenants.default_quota:
            return None
        if sum(r.client_id == client_id for r in self.reservations.values()) >= MAX_PER_CLIENT:
            return None
        if len(self.quarantine):
            self.release_quarantined(now)
        for segment in self._placement(client_id, config):
            address = segment.allocator.try_allocate(length)
            if address is not None:
                reservation_id = self._reservation_ids.getrandbits(62)  # a restarted master's differ
                while reservation_id in self.reservations:
                    reservation_id = self._reservation_ids.getrandbits(62)
                self.reservations[reservation_id] = Reservation(reservation_id, client_id, segment.segment_id,
                                                                address, length, now, config)
                self.stats.num_reservations += 1
                replica = segment.describe(Replica(segment.segment_id, address), length)
                return SpaceGrant(reservation_id, replica, segment.allocator.alignment)
        return None

    def _release_own(self, client_id: str, reservation_ids: list[int]) -> None:
        for reservation_id in reservation_ids:
            reservation = self.reservations.get(reservation_id)
            if reservation is not None and reservation.client_id == client_id:
                self._release_reservation(reservation)

    def _release_reservation(self, reservation: Reservation) -> None:
        del self.reservations[reservation.reservation_id]
        self.segments[reservation.segment_id].allocator.free(reservation.address)

    def _release_reservations_of(self, client_id: str) -> None:
        for reservation in [r for r in self.reservations.values() if r.client_id == client_id]:
            self._release_reservation(reservation)

    def _release_reservations_on(self, segment_id: str) -> None:
        """Free the reservations on a segment that takes no new objects from now on (draining)."""
        for reservation in [r for r in self.reservations.values() if r.segment_id == segment_id]:
            self._release_reservation(reservation)

    def _forget_reservations_on(self, segment_id: str) -> None:
        """Drop the reservations on a segment being unmounted: its ranges go with it."""
        for reservation_id in [i for i, r in self.reservations.items() if r.segment_id == segment_id]:
            del self.reservations[reservation_id]
