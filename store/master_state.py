"""The master's state machine: segments, clients, objects, replicas, leases, pins, eviction.

Pure: no sockets, no threads, no clock. Every method that needs time takes ``now`` (seconds, the
daemon's monotonic clock), so a test can replay any interleaving exactly. The master daemon wraps
one instance, serialises calls to it, and calls :meth:`MasterState.evict` and
:meth:`MasterState.expire_clients` from its loop.

Lifecycle of an object::

    put_start ──► PROCESSING ──put_end──► COMPLETE ──remove / evict──► gone
                      │                      │
                      └──put_revoke──► gone  └──upsert_start──► PROCESSING (same ranges if same size)

Keys here are scoped keys (:mod:`store.tenants`): the service scopes a client's key by its
tenant, so two tenants' objects never meet, and each tenant's memory is counted in ``tenants``
and bounded by its quota. Eviction to make room for a put takes only the putting tenant's
objects; background eviction is shared fairly (see :meth:`MasterState.evict`).

Errors are the typed ones of :mod:`store.errors`; batch forms return, per item, either the result
or the error instance (never raise for one bad item).

Every complete memory replica that appears or goes is recorded in ``kv_events``
(:mod:`store.events.recorder`), which the store service drains after each call and publishes.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from store.drain.state import Drain, Draining
from store.events.recorder import EventLog
from store.errors import (IllegalClient, InvalidParams, MooncakeError, NoAvailableHandle,
                          ObjectAlreadyExists, ObjectHasLease, ObjectNotFound, ReplicaIsNotReady,
                          TenantQuotaExceeded)
from store.grant_quarantine import GrantQuarantine
from store.eviction import eviction_candidates
from store.membership import Membership
from store.objects import (ClientState, ObjectMeta, Replica, ReplicaDescriptor, ReplicaList,
                           ReplicaStatus, ReplicateConfig, SegmentState, tuple_of)
from store.placement import placement_order
from store.policy import StorePolicy
from store.replication import Replication
from store.reservations.state import Reservation, Reservations
from store.segment_journal import Completion, SegmentJournal
from store.stats import MasterStats
from store.tenants import (DEFAULT_TENANT, KEY_SEPARATOR, TenantLedger, local_key, parse_quotas, shown, split_key,
                           tenant_of)
from store.tiering import PROMOTE_AFTER_DISK_READS, Tiering

DEFAULT_CONFIG = ReplicateConfig()


class MasterState(Membership, Tiering, Replication, Draining, Reservations):
    def __init__(self, policy: StorePolicy = StorePolicy(), seed: int | None = None) -> None:
        self.policy = policy
        self.stats = MasterStats()
        self.segments: dict[str, SegmentState] = {}  # mount order: the round `random` walks
        self.clients: dict[str, ClientState] = {}
        self.objects: dict[str, ObjectMeta] = {}
        # Complete objects, least recently used first: the eviction order.
        self.lru: OrderedDict[str, None] = OrderedDict()
        self._rng = random.Random(seed)
        # Tenants whose put had to evict: the next evict() makes headroom even below the
        # watermark, from their objects only, so their following puts do not each pay for it.
        self._evicting_for: set[str] = set()
        self.tenants = TenantLedger(parse_quotas(policy.tenant_quotas), policy.default_tenant_quota)
        # Per segment, the changes its owner has not seen yet (it re-reports them after a restart).
        self.journal = SegmentJournal()
        # offload_policy "evicted": eviction victims handed to their segment's owner to copy to
        # disk, by key, with the time after which they are freed (and lost) without that copy.
        self.offload_pending: dict[str, float] = {}
        # KV events (replicas stored / removed) the service has not published yet.
        self.kv_events = EventLog()
        # Segments being drained, by id: closed to new replicas (store.drain.state).
        self.drains: dict[str, Drain] = {}
        # Freed ranges a tenant may still hold a grant on: not reused until it expired.
        self.quarantine = GrantQuarantine()
        # Ranges granted to clients for their next small puts, by id (store.reservations). The
        # ids come from a generator of their own: drawing them must not move placement's.
        self.reservations: dict[int, Reservation] = {}
        self._reservation_ids = random.Random(None if seed is None else seed + 1)

    # == writes ===============================================================================
    def put_start(self, client_id: str, key: str, size: int, now: float,
                  config: ReplicateConfig = DEFAULT_CONFIG) -> list[ReplicaDescriptor]:
        """Allocate ``config.replica_num`` replicas (PROCESSING) on distinct segments.

        Best effort like Mooncake: fewer segments than replicas gives fewer replicas; none at all,
        even after evicting everything evictable, raises NoAvailableHandle.
        """
        self._check_config(config)
        self._touch(client_id, now)
        return self._put_start(client_id, key, size, now, config, self._placement(client_id, config))

    def _put_start(self, client_id: str, key: str, size: int, now: float, config: ReplicateConfig,
                   order: list[SegmentState]) -> list[ReplicaDescriptor]:
        """put_start of one key, once its config was checked and its client touched."""
        self._check_key(key)
        self._check_size(size)
        existing = self.objects.get(key)
        if existing is not None:
            self._preempt_or_refuse(existing, now)
        return self._allocate(client_id, key, size, now, config, order)

    def upsert_start(self, client_id: str, key: str, size: int, now: float,
                     config: ReplicateConfig = DEFAULT_CONFIG) -> list[ReplicaDescriptor]:
        """Like put_start, but an existing complete object is overwritten: in place when the size
        is unchanged, else its ranges are freed and new ones allocated. Finish with put_end or
        put_revoke (which removes the object: its old bytes may be half overwritten)."""
        self._check_put(key, size, config)
        self._touch(client_id, now)
        existing = self.objects.get(key)
        if existing is None:
            return self._allocate(client_id, key, size, now, config, self._placement(client_id, config))
        if not existing.complete:
            self._preempt_or_refuse(existing, now)
            return self._allocate(client_id, key, size, now, config, self._placement(client_id, config))
        if existing.leased(now):
            raise ObjectHasLease(f"{shown(key)} is being read; it cannot be overwritten yet")
        if existing.size != size or not all(r.in_memory for r in existing.replicas) \
                or any(r.segment_id in self.drains for r in existing.replicas):
            # A disk copy would be stale, and a draining segment takes no new bytes: overwrite
            # in newly allocated memory only.
            self._drop(existing)
            return self._allocate(client_id, key, size, now, config, self._placement(client_id, config))
        self.lru.pop(key, None)
        self.offload_pending.pop(key, None)  # its owner's copy, if one comes, is refused as stale
        self._abandon_copy(existing)  # it was reading the bytes now overwritten
        obj = self._new_object(client_id, key, size, now, config, existing.replicas)
        for replica in obj.replicas:
            replica.status = ReplicaStatus.PROCESSING
            self.journal.gone(replica.segment_id, key, replica.address)  # being overwritten
            self.kv_events.removed(key, replica.segment_id)
        self.objects[key] = obj
        self.stats.num_put_starts += 1
        return self._describe(obj)

    def put_end(self, client_id: str, key: str, now: float, checksum: int | None = None) -> None:
        """Mark every replica COMPLETE: from now on readers see the object. Idempotent for the
        writer, so a retried PutEnd after a lost reply succeeds."""
        self._touch(client_id, now)
        self._put_end(client_id, key, now, checksum)

    def _put_end(self, client_id: str, key: str, now: float, checksum: int | None) -> None:
        obj = self._owned(client_id, key)
        if obj.complete:
            return
        completions: list[Completion] = []
        stored: list[tuple[str, str]] = []
        self._mark_complete(obj, now, checksum, completions, stored)
        self.journal.completed_many(completions)
        self.kv_events.stored_many(stored)

    def _mark_complete(self, obj: ObjectMeta, now: float, checksum: int | None,
                       completions: list[Completion], stored: list[tuple[str, str]]) -> None:
        """Mark ``obj``'s replicas COMPLETE; what the journal and the KV events must record of it
        is added to ``completions`` and ``stored``, for the caller to append (a batch: once)."""
        key, size, hard_pinned = obj.key, obj.size, obj.hard_pinned
        for replica in obj.replicas:
            replica.status = ReplicaStatus.COMPLETE
            completions.append((replica.segment_id, key, replica.address, size, checksum, hard_pinned))
            stored.append((key, replica.segment_id))
        obj.checksum = checksum
        obj.last_access = now
        if obj.soft_pin_ttl is not None:
            obj.soft_pin_deadline = now + obj.soft_pin_ttl  # fixed from completion; reads never extend it
        self.lru[key] = None
        self.stats.num_put_ends += 1

    def put_revoke(self, client_id: str, key: str, now: float) -> None:
        self._touch(client_id, now)
        obj = self._owned(client_id, key)
        if obj.complete:
            raise InvalidParams(f"{shown(key)} is complete; remove it instead of revoking")
        self._drop(obj)
        self.stats.num_put_revokes += 1

    def batch_put_start(self, client_id: str, keys: list[str], sizes: list[int], now: float,
                        config: ReplicateConfig = DEFAULT_CONFIG) -> list[list[ReplicaDescriptor] | MooncakeError]:
        self._check_batch(keys, sizes)
        try:  # what holds for every key is checked once
            self._check_config(config)
            self._touch(client_id, now)
        except MooncakeError as exc:
            return [exc] * len(keys)
        # One placement order for the whole batch: its objects fill the same segments in turn
        # (spilling over when one is full), and the per-key shuffle was most of a batch's cost.
        order = self._placement(client_id, config)
        if not self._quota_holds(keys, sizes, config.replica_num):
            # A tenant may have to evict for its quota, or be refused: key by key.
            return [_attempt(self._put_start, client_id, k, n, now, config, order) for k, n in zip(keys, sizes)]
        # _put_start of each key, less what holds for all of them: each tenant's quota has room
        # for the whole batch (so no key needs to check it), and held ranges are released only
        # when there are any (a key that preempts or evicts may have added some).
        objects, quarantine = self.objects, self.quarantine
        results: list[list[ReplicaDescriptor] | MooncakeError] = []
        for key, size in zip(keys, sizes):
            try:
                self._check_key(key)
                self._check_size(size)
                if key in objects:  # taken, or an abandoned put to preempt: as a single put does
                    results.append(self._put_start(client_id, key, size, now, config, order))
                    continue
                if len(quarantine):
                    self.release_quarantined(now)
                results.append(self._place(client_id, key, size, now, config, order, tenant_of(key)))
            except MooncakeError as exc:
                results.append(exc)
        return results

    def _quota_holds(self, keys: list[str], sizes: list[int], replica_num: int) -> bool:
        """True when every tenant of ``keys`` has room in its quota for all of them at once: no
        key of the batch can then need to evict for its quota, or be refused. (Charges taken
        earlier in the batch are within that room, and frees only add to it.)"""
        tenants = self.tenants
        if not tenants.quotas and not tenants.default_quota:  # unlimited: the common case
            return True
        if not all(isinstance(k, str) for k in keys) or not all(type(n) is int for n in sizes):
            return False  # those keys fail their checks; the rest are checked key by key
        replicas = min(replica_num, max(1, len(self.segments)))
        need: dict[str, int] = {}
        for key, size in zip(keys, sizes):
            tenant = tenant_of(key)
            need[tenant] = need.get(tenant, 0) + max(size, 0) * replicas
        for tenant, wanted in need.items():
            room = tenants.room(tenant)
            if room is not None and room < wanted:
                return False
        return True

    def batch_upsert_start(self, client_id: str, keys: list[str], sizes: list[int], now: float,
                           config: ReplicateConfig = DEFAULT_CONFIG) -> list[list[ReplicaDescriptor] | MooncakeError]:
        self._check_batch(keys, sizes)
        return [_attempt(self.upsert_start, client_id, k, n, now, config) for k, n in zip(keys, sizes)]

    def batch_put_end(self, client_id: str, keys: list[str], now: float,
                      checksums: list[int | None] | None = None) -> list[None | MooncakeError]:
        checksums = [None] * len(keys) if checksums is None else checksums
        self._check_batch(keys, checksums)
        try:
            self._touch(client_id, now)
        except MooncakeError as exc:
            return [exc] * len(keys)
        # _put_end of each key in one pass: what they record (journal changes, KV events) is
        # appended once for the whole batch, in the order the keys completed.
        objects = self.objects
        results: list[None | MooncakeError] = []
        completions: list[Completion] = []
        stored: list[tuple[str, str]] = []
        for key, checksum in zip(keys, checksums):
            obj = objects.get(key)
            if obj is None or obj.owner != client_id:
                results.append(_attempt(self._owned, client_id, key))  # its error
                continue
            results.append(None)
            if not obj.complete:
                self._mark_complete(obj, now, checksum, completions, stored)
        self.journal.completed_many(completions)
        self.kv_events.stored_many(stored)
        return results

    def batch_put_revoke(self, client_id: str, keys: list[str], now: float) -> list[None | MooncakeError]:
        return [_attempt(self.put_revoke, client_id, k, now) for k in keys]

    # == reads ================================================================================
    def get_replica_list(self, key: str, now: float) -> ReplicaList:
        """The complete replicas of ``key``, and a read lease of ``lease_ttl`` on the object: until
        it runs out the object is neither removed (unless forced), overwritten nor evicted."""
        obj = self.objects.get(key)
        if obj is None:
            raise ObjectNotFound(f"no object {shown(key)}")
        if not obj.complete:
            raise ReplicaIsNotReady(f"{shown(key)} is still being written")
        return self._lease(obj, now)

    def _lease(self, obj: ObjectMeta, now: float) -> ReplicaList:
        """get_replica_list of complete ``obj``: its lease, its use, its replicas."""
        key, lease_ttl = obj.key, self.policy.lease_ttl
        deadline = now + lease_ttl
        if obj.lease_deadline < deadline:
            obj.lease_deadline = deadline
        obj.last_access = now
        lru = self.lru
        if key in lru:
            lru.move_to_end(key)
            if self.offload_pending:  # used again: no longer a victim; a disk copy is just kept
                self.offload_pending.pop(key, None)
        elif obj.promoting is None:  # only on disk
            obj.disk_reads += 1
        self.stats.num_leases_granted += 1
        promote = obj.promoting is None and obj.disk_reads >= PROMOTE_AFTER_DISK_READS
        return tuple_of(ReplicaList, (local_key(key), obj.size, self._describe(obj), lease_ttl, obj.checksum,
                                      promote))

    def batch_get_replica_list(self, keys: list[str], now: float) -> list[ReplicaList | MooncakeError]:
        objects = self.objects
        results: list[ReplicaList | MooncakeError] = []
        for key in keys:
            obj = objects.get(key)
            if obj is not None and obj.complete:
                results.append(self._lease(obj, now))
            else:
                results.append(_attempt(self.get_replica_list, key, now))  # its error
        return results

    def exists(self, key: str) -> bool:
        """True when a complete replica exists. Grants no lease and does not count as a use, so
        probing (prefix matching) never keeps an object from being evicted."""
        obj = self.objects.get(key)
        return obj is not None and obj.complete

    def batch_exists(self, keys: list[str]) -> list[bool]:
        return [self.exists(k) for k in keys]

    # == removal and eviction =================================================================
    def remove(self, key: str, now: float, force: bool = False) -> None:
        obj = self.objects.get(key)
        if obj is None:
            raise ObjectNotFound(f"no object {shown(key)}")
        if not obj.complete:
            raise ReplicaIsNotReady(f"{shown(key)} is still being written; revoke it instead")
        if obj.leased(now) and not force:
            raise ObjectHasLease(f"{shown(key)} is leased to a reader for {obj.lease_deadline - now:.3f}s more")
        self._drop(obj)
        self.stats.num_removed += 1

    def batch_remove(self, keys: list[str], now: float, force: bool = False) -> list[None | MooncakeError]:
        return [_attempt(self.remove, k, now, force) for k in keys]

    def set_tenant_quota(self, tenant: str, quota: int) -> None:
        """Set ``tenant``'s quota (0: unlimited) at run time; the op log keeps it for a successor."""
        self.tenants.set_quota(tenant, quota)
        self.journal.quota_set(tenant, quota)

    def remove_all(self, now: float, force: bool = False, tenant: str = DEFAULT_TENANT) -> int:
        """Remove every complete object of ``tenant`` with no lease (every complete one when
        forced). When no complete memory replica is left (of any tenant), one AllBlocksCleared
        event replaces the removals."""
        doomed = [o for o in self.objects.values()
                  if o.complete and (force or not o.leased(now)) and tenant_of(o.key) == tenant]
        mark = self.kv_events.mark()
        for obj in doomed:
            self._drop(obj)
        if not any(r.in_memory for o in self.objects.values() if o.complete for r in o.replicas):
            self.kv_events.cleared_since(mark)
        self.stats.num_removed += len(doomed)
        return len(doomed)

    def evict(self, now: float) -> list[str]:
        """Background eviction; returns the evicted keys in eviction order.

        First, a tenant holding more than its quota (it was lowered at run time) loses its LRU
        objects until it is within it. Then, when usage is above ``high_watermark``, objects are
        evicted until usage is ``eviction_ratio`` below min(usage, watermark), every tenant giving
        in proportion to the memory it holds (see :meth:`_fair_victims`). Below the watermark, a
        tenant whose put recently had to evict makes that headroom from its own objects.

        With offload_policy "evicted", a victim its segment's owner can copy to disk is handed to
        that owner instead (see :meth:`_hand_over`) and freed when the copy is reported; one not
        reported within ``client_ttl`` is freed here without it (the owner is as good as dead)."""
        expired = [self.objects[k] for k, deadline in self.offload_pending.items() if deadline <= now]
        self.stats.num_offload_timeouts += len(expired)
        evicted = self._evict(expired) + self._evict_over_quota(now)
        capacity, used = self.capacity, self.used_bytes
        if capacity == 0:
            return evicted
        watermark = self.policy.high_watermark * capacity
        if used <= watermark and not self._evicting_for:
            return evicted
        tenants = None if used > watermark else self._evicting_for
        self._evicting_for = set()
        target = min(used, watermark) - self.policy.eviction_ratio * capacity
        victims = [obj for obj in self._fair_victims(used - target, now, tenants)
                   if obj.key not in self.offload_pending and not self._hand_over(obj, now)]
        return evicted + self._evict(victims)

    def _fair_victims(self, need: float, now: float, tenants: set[str] | None) -> list[ObjectMeta]:
        """Evictable objects holding ``need`` bytes of memory, from ``tenants`` (None: all).

        Each tenant's share of ``need`` is in proportion to the memory it holds, taken from its
        own objects in eviction order (unpinned LRU first, soft-pinned last); what a tenant
        cannot give (its objects are leased or pinned) is then taken from the others in plain
        eviction order. A pending hand-over counts as freed: its bytes are on their way out.
        With one tenant this is plain LRU eviction."""
        held = {t: n for t, n in self.tenants.used.items() if tenants is None or t in tenants}
        total = sum(held.values())
        share = {t: need * n / total for t, n in held.items()} if total else {}
        given = dict.fromkeys(held, 0)
        chosen: dict[str, ObjectMeta] = {}
        freed = 0
        for fair in (True, False):
            for obj in self._candidates(now, tenants):
                if freed >= need:
                    return list(chosen.values())
                tenant = tenant_of(obj.key)
                if obj.key in chosen or (fair and given.get(tenant, 0) >= share.get(tenant, 0)):
                    continue
                memory = sum(self._block_bytes(r) for r in obj.replicas if r.in_memory)
                chosen[obj.key] = obj
                given[tenant] = given.get(tenant, 0) + memory
                freed += memory
        return list(chosen.values())

    def _evict_over_quota(self, now: float) -> list[str]:
        """Evict LRU objects of each tenant holding more than its quota until it is within it."""
        victims = []
        for tenant in [t for t in self.tenants.used if self.tenants.excess(t)]:
            excess, freed = self.tenants.excess(tenant), 0
            for obj in self._candidates(now, {tenant}):
                if freed >= excess:
                    break
                victims.append(obj)
                freed += obj.size * sum(r.in_memory for r in obj.replicas)
        self.stats.num_quota_evictions += len(victims)
        return self._evict(victims)

    def _candidates(self, now: float, tenants: set[str] | None = None):
        """Evictable objects in eviction order (store.eviction), of ``tenants`` only unless None."""
        found = eviction_candidates(self.lru, self.objects, now, self.policy.allow_evict_soft_pinned)
        return found if tenants is None else (obj for obj in found if tenant_of(obj.key) in tenants)

    # == totals ===============================================================================
    @property
    def capacity(self) -> int:
        return sum(s.allocator.capacity for s in self.segments.values())

    @property
    def used_bytes(self) -> int:
        return sum(s.allocator.num_used_bytes for s in self.segments.values())

    # == helpers ==============================================================================
    def _key_errors(self, keys: list[str]) -> list[MooncakeError | None]:
        """Per key None, or the error :meth:`_check_key` raises for it. Without a call per key
        when no key could fail: a string of at most a quarter of ``max_key_length`` characters
        (a character is at most 4 bytes of UTF-8) that does not end with the tenant separator
        (a scoped key's own part is then not empty)."""
        limit = self.policy.max_key_length // 4
        if all(type(k) is str and 0 < len(k) <= limit and k[-1] != KEY_SEPARATOR for k in keys):
            return [None] * len(keys)
        return [_attempt(self._check_key, k) for k in keys]

    def _check_key(self, key: str) -> None:
        local = split_key(key)[1] if isinstance(key, str) else ""
        if not local:
            raise InvalidParams("key must be a non-empty string")
        if len(local.encode()) > self.policy.max_key_length:
            raise InvalidParams(f"key is longer than {self.policy.max_key_length} bytes")

    @staticmethod
    def _check_size(size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidParams(f"size must be a positive integer, got {size!r}")

    def _check_put(self, key: str, size: int, config: ReplicateConfig) -> None:
        self._check_key(key)
        self._check_size(size)
        self._check_config(config)

    @staticmethod
    def _check_config(config: ReplicateConfig) -> None:
        n = config.replica_num
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidParams(f"replica_num must be >= 1, got {n!r}")
        if config.soft_pin_ttl is not None and not config.soft_pin_ttl > 0:
            raise InvalidParams(f"soft_pin_ttl must be > 0, got {config.soft_pin_ttl!r}")

    @staticmethod
    def _check_batch(keys: list, values: list) -> None:
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")

    def _owned(self, client_id: str, key: str) -> ObjectMeta:
        obj = self.objects.get(key)
        if obj is None:
            raise ObjectNotFound(f"no object {shown(key)} (revoked, preempted or never started)")
        if obj.owner != client_id:
            raise IllegalClient(f"{shown(key)} was started by another client")
        return obj

    def _preempt_or_refuse(self, existing: ObjectMeta, now: float) -> None:
        """A key is taken while complete, or while its put is younger than the discard timeout;
        an older put is presumed abandoned and is revoked so the new one can proceed."""
        age = now - existing.put_start_time
        if existing.complete or age < self.policy.put_start_discard_timeout:
            raise ObjectAlreadyExists(f"{shown(existing.key)} already exists")
        self._drop(existing)
        self.stats.num_preempted += 1

    def _new_object(self, client_id: str, key: str, size: int, now: float, config: ReplicateConfig,
                    replicas: list[Replica]) -> ObjectMeta:
        return ObjectMeta(key, size, client_id, replicas, now, hard_pinned=config.hard_pin,
                          soft_pin_ttl=self._soft_pin_ttl(config))

    def _soft_pin_ttl(self, config: ReplicateConfig) -> float | None:
        """How long a put with ``config`` stays soft-pinned once complete; None: not pinned."""
        if not config.soft_pin:
            return None
        return min(config.soft_pin_ttl or self.policy.soft_pin_ttl, self.policy.max_soft_pin_ttl)

    def _placement(self, client_id: str, config: ReplicateConfig) -> list[SegmentState]:
        """The order in which a put by ``client_id`` tries the segments (store.placement)."""
        local_host = config.host
        return placement_order(
            self.policy.allocation_strategy, self._open_segments(), config.preferred_segments,
            lambda s: s.client_id == client_id or bool(local_host and s.spec.host == local_host),
            self._rng)

    def _allocate(self, client_id: str, key: str, size: int, now: float, config: ReplicateConfig,
                  order: list[SegmentState]) -> list[ReplicaDescriptor]:
        tenant = tenant_of(key)
        self.release_quarantined(now)
        self._make_quota_room(tenant, key, size, config.replica_num, now)
        return self._place(client_id, key, size, now, config, order, tenant)

    def _place(self, client_id: str, key: str, size: int, now: float, config: ReplicateConfig,
               order: list[SegmentState], tenant: str) -> list[ReplicaDescriptor]:
        """The new object ``key``'s replicas, on the first segments of ``order`` that fit them
        (evicting ``tenant``'s objects when none does), once its quota let it take them."""
        wanted = config.replica_num
        replicas: list[Replica] = []
        used: set[str] = set()  # the segments of ``replicas``
        # What _describe would answer (memory replicas only, in this order), built as they are
        # placed: it is per key of a batch.
        described: list[ReplicaDescriptor] = []
        while True:
            for segment in order:
                if len(replicas) == wanted:
                    break
                segment_id = segment.spec.segment_id
                if segment_id in used:
                    continue
                address = segment.allocator.try_allocate(size)
                if address is not None:
                    self.tenants.charge(tenant, size)
                    replica = Replica(segment_id, address)
                    replicas.append(replica)
                    described.append(segment.describe(replica, size))
                    used.add(segment_id)
            # A full pool of the tenant's evictable objects must never fail its put: evict
            # synchronously (never another tenant's objects).
            if len(replicas) == wanted or not self._evict_for(size, used, now, tenant):
                break
            self._evicting_for.add(tenant)
        if not replicas:
            self.stats.num_allocation_failures += 1
            raise NoAvailableHandle(f"no segment can hold {size} bytes for {shown(key)}")
        if len(replicas) < config.replica_num:
            self.stats.num_partial_allocations += 1
        self.objects[key] = self._new_object(client_id, key, size, now, config, replicas)
        self.stats.num_put_starts += 1
        return described

    def _make_quota_room(self, tenant: str, key: str, size: int, replica_num: int, now: float) -> None:
        """Let ``tenant`` take ``replica_num`` ranges of ``size`` bytes: within its quota, or by
        evicting its own LRU objects (as Mooncake does); TenantQuotaExceeded, evicting nothing,
        when even that is not enough."""
        room = self.tenants.room(tenant)
        # Replicas are best effort: no more can be placed than there are segments.
        need = size * min(replica_num, max(1, len(self.segments)))
        if room is None or room >= need:
            return
        victims, freed = [], 0
        for obj in self._candidates(now, {tenant}):
            victims.append(obj)
            freed += obj.size * sum(r.in_memory for r in obj.replicas)
            if room + freed >= need:
                self.stats.num_quota_evictions += len(victims)
                self._evict(victims)
                return
        self.stats.num_quota_rejections += 1
        raise TenantQuotaExceeded(
            f"tenant {tenant!r} holds {self.tenants.used.get(tenant, 0)} of its {self.tenants.quota(tenant)} "
            f"bytes; {shown(key)} needs {need} and evicting its objects frees only {freed}")

    def _evict_for(self, size: int, excluded: set[str], now: float, tenant: str) -> bool:
        """Evict LRU objects of ``tenant`` holding space on segments that could take one more
        replica, until one of them has enough free bytes. False when nothing there is evictable."""
        eligible = {s.segment_id: s for s in self._open_segments()
                    if s.segment_id not in excluded and s.allocator.block_size(size) <= s.allocator.capacity}
        # First spare what an owner could copy to disk; if that frees too little, evict those
        # too, without a copy: a put never waits on an owner.
        for spare in (True, False):
            victims, enough = self._victims_for(size, eligible, now, spare, tenant)
            if enough:
                break
        self._evict(victims)
        return bool(victims)

    def _victims_for(self, size: int, eligible: dict[str, SegmentState], now: float,
                     spare_offloadable: bool, tenant: str) -> tuple[list[ObjectMeta], bool]:
        """LRU victims of ``tenant`` on ``eligible`` segments until one of them would fit
        ``size``; and whether one would."""
        freed = dict.fromkeys(eligible, 0)
        victims = []
        for obj in self._candidates(now, {tenant}):
            hits = [r for r in obj.replicas if r.in_memory and r.segment_id in eligible]
            if not hits or (spare_offloadable and self._offload_source(obj) is not None):
                continue
            victims.append(obj)
            for r in hits:
                freed[r.segment_id] += self._block_bytes(r)
            if any(eligible[r.segment_id].allocator.num_free_bytes + freed[r.segment_id]
                   >= eligible[r.segment_id].allocator.block_size(size) for r in hits):
                return victims, True
        return victims, False

    def _offload_source(self, obj: ObjectMeta) -> Replica | None:
        """With offload_policy "evicted": the memory replica whose segment's owner can copy
        ``obj`` to disk. None when it has a disk copy already, or no checksum (the owner checks
        its copy against it), or no owner of its memory replicas has an SSD tier."""
        if self.policy.offload_policy != "evicted" or obj.checksum is None \
                or not all(r.in_memory for r in obj.replicas):
            return None
        return next((r for r in obj.replicas if self.segments[r.segment_id].spec.disk_endpoint), None)

    def _hand_over(self, obj: ObjectMeta, now: float) -> bool:
        """Ask the owner (through its next ping answer) to copy victim ``obj`` to disk, instead of
        freeing it now; False when it cannot be offloaded."""
        source = self._offload_source(obj)
        if source is None:
            return False
        self.offload_pending[obj.key] = now + self.policy.client_ttl
        self.journal.offload(source.segment_id, obj.key, source.address, obj.size, obj.checksum)
        self.stats.num_offload_requests += 1
        return True

    def _evict(self, victims: list[ObjectMeta]) -> list[str]:
        """Free the victims' memory; one with a disk replica lives on there, out of the LRU."""
        for obj in victims:
            self.offload_pending.pop(obj.key, None)
            if all(r.in_memory for r in obj.replicas):
                self._drop(obj)
                continue
            for replica in [r for r in obj.replicas if r.in_memory]:
                self._free(obj, replica)
            obj.replicas = [r for r in obj.replicas if not r.in_memory]
            obj.disk_reads = 0
            self.lru.pop(obj.key, None)
            self.stats.num_evicted_to_disk += 1
        self.stats.num_evicted += len(victims)
        self.stats.num_evicted_bytes += sum(obj.size for obj in victims)
        return [obj.key for obj in victims]

    def _drop(self, obj: ObjectMeta) -> None:
        self._abandon_copy(obj)
        for replica in obj.replicas + ([obj.promoting] if obj.promoting else []):
            self._free(obj, replica)
        del self.objects[obj.key]
        self.lru.pop(obj.key, None)
        self.offload_pending.pop(obj.key, None)

    def _free(self, obj: ObjectMeta, replica: Replica) -> None:
        key = obj.key
        if replica.in_memory:
            self._return_range(key, replica, obj.size)
            self.journal.gone(replica.segment_id, key, replica.address)
            if replica.status is ReplicaStatus.COMPLETE:  # readers knew of it
                self.kv_events.removed(key, replica.segment_id)
        else:
            self.journal.disk_gone(replica.segment_id, key)

    def _take_range(self, segment: SegmentState, key: str, size: int) -> int:
        """A range of ``size`` bytes on ``segment`` for ``key``, charged to its tenant."""
        address = segment.allocator.allocate(size)
        self.tenants.charge(tenant_of(key), size)
        return address

    def _return_range(self, key: str, replica: Replica, size: int) -> None:
        """Free the memory range ``replica`` of ``key`` (``size`` bytes), uncharged from its tenant
        (a range a tenant may still hold a grant on is freed once that expired: store.grant_quarantine)."""
        if not self.quarantine.hold(replica.segment_id, replica.address):
            self.segments[replica.segment_id].allocator.free(replica.address)
        self.tenants.release(tenant_of(key), size)

    def release_quarantined(self, now: float) -> None:
        """Free the quarantined ranges whose grants have expired by ``now``."""
        for segment_id, address in self.quarantine.released(now):
            self.segments[segment_id].allocator.free(address)

    def _block_bytes(self, replica: Replica) -> int:
        return self.segments[replica.segment_id].allocator.allocated_size(replica.address)

    def _describe(self, obj: ObjectMeta) -> list[ReplicaDescriptor]:
        """Memory replicas first: a reader tries them before any disk one."""
        replicas = obj.replicas
        if len(replicas) == 1:  # the common case, per key of a batch: no sort, no comprehension
            replica = replicas[0]
            return [self.segments[replica.segment_id].describe(replica, obj.size)]
        replicas = sorted(replicas, key=lambda r: not r.in_memory)
        return [self.segments[r.segment_id].describe(r, obj.size) for r in replicas]


def _attempt(method, *args):
    """One item of a batch: its result, or the typed error it raised."""
    try:
        return method(*args)
    except MooncakeError as exc:
        return exc
