"""The store half of the master daemon: MasterState behind RPC ops, one lock, the daemon's clock.

Ops (args -> result; errors are the typed store errors). Every op that names keys also takes
``tenant`` (absent: ``default``), which scopes them (:mod:`store.tenants`): ``key`` below is
the client's key in its tenant's namespace. The owner-side ops (add_disk_replica, remount, ping)
carry the master's scoped keys as the journal handed them out.

    store.put_start / store.upsert_start    {client_id, key, size, config}   -> [replica]
    store.put_end                           {client_id, key, checksum?}      -> nil
    store.put_revoke                        {client_id, key}                 -> nil
    store.batch_put_start / batch_upsert_start {client_id, keys, sizes, config} -> [item]
    store.batch_put_end                     {client_id, keys, checksums?}    -> [item]
    store.batch_put_revoke                  {client_id, keys}                -> [item]
    store.reserve_space                     {client_id, length, config, release?: [id]} -> grant | nil
    store.batch_put_commit                  {client_id, reservation, keys, offsets, sizes, checksums?,
                                             config? (the grant's), consumed?, reserve?, release?}
                                            -> {results: [item], reservation: grant | nil}
    store.get_replica_list                  {key}                            -> replica list
    store.batch_get_replica_list            {keys}                           -> [item]
    store.exists / store.batch_exists       {key} / {keys}                   -> bool / [bool]
    store.remove                            {key, force?}                    -> nil
    store.batch_remove                      {keys, force?}                   -> [item]
    store.remove_all                        {force?}                         -> int (the tenant's)
    store.mount_segment                     {client_id, segment}             -> nil
    store.unmount_segment                   {client_id, segment_id}          -> [lost keys]
    store.add_disk_replica                  {client_id, key, segment_id, address, checksum} -> nil
    store.promote_start                     {client_id, key, host?}          -> replica
    store.promote_end / promote_revoke      {client_id, key}                 -> nil
    store.copy_start                        {client_id, key, segment_ids}    -> {sources, targets, checksum}
    store.copy_end                          {client_id, key, drop_segment?}  -> nil
    store.copy_revoke                       {client_id, key}                 -> nil
    store.drain_start                       {client_id, segment_id}          -> DrainPlan
    store.drain_pending                     {client_id, segment_id, limit, skip?} -> DrainPending
    store.drain_move_start                  {client_id, segment_id, key}     -> {sources, targets, checksum}
    store.drain_finish                      {client_id, segment_id}          -> DrainFinish
    store.drain_cancel                      {client_id, segment_id}          -> nil
    store.drain_status                      {client_id, segment_id}          -> DrainStatus
    store.remount                           {client_id, segments, objects, disk_objects?}
                                            -> {accepted, rejected, disk_rejected}
    store.ping                              {client_id, acks: {segment: seq}}
                                            -> {status, changes, unmount: [drained segment ids]}
    store.inspect                           {what: counters|segments|objects|clients|key|tenants, key?}
    store.set_tenant_quota                  {tenant, quota}                  -> tenant row
    store.kv_events                         {}  -> {address, replay_address, epoch, sequence}
    store.kv_snapshot                       {}  -> {address, replay_address, epoch, sequence,
                                                    blocks: [[key, segment_id]]}

Tenant credentials (:class:`transfer.auth.TenantCredential`): a request that came with one acts
for that tenant only (:attr:`transfer.rpc.client_server.Request.tenant`). It may ask for the ops
of :data:`TENANT_OPS` alone, on its own tenant's keys: naming another tenant, or asking
``inspect`` for anything but its own objects, is UNAUTHORIZED. Mounting segments, quotas,
draining, copies, KV events (they list every tenant's keys) and the HA ops take the cluster
secret. Each memory replica a tenant's put or get is handed carries a grant
(:mod:`transfer.grants`): a segment owner moves a tenant's bytes only inside granted ranges.

The drain ops' answers are the dataclasses of :mod:`store.drain.messages`; the drain itself is
described in :mod:`store.drain.state`.

Put reservations (:mod:`store.reservations`): a grant is ``[id, replica, alignment]``; a commit
publishes the objects a client wrote into its reservation, as PutStart and PutEnd of each would,
and may hand out the next one. Cluster-secret clients only: a tenant's credential puts the plain way.

A batch item is ``{"ok": value}`` or ``{"error": {...}}`` (see :mod:`store.wire`). The handlers
run on the RPC I/O thread: each holds the lock for microseconds, and skipping the pool's hand-off
is what keeps a 4 KiB put near one round trip per phase.

KV events: the events an op recorded (:mod:`store.events.recorder`) are taken from the state at
the end of the op and handed to the publisher (:mod:`store.events.publisher`) before the lock is
released: a deque append, no system call, and the lock is what keeps two threads' (the I/O
thread's, the tick's) events in the order they happened. Encoding and sending happen on the
publisher's thread. ``store.kv_snapshot`` reads every complete memory replica as (key, segment)
under the lock, marks that point in the event stream and, off the lock, waits (a few ms) for the
sequence number of the last batch before the mark: a subscriber that missed a batch rebuilds its
view from the snapshot and follows the batches after that number. ``store.kv_events`` is its
cheap half (no blocks, the last batch sent), for subscribers that poll for gaps.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from collections.abc import Callable

from store import views
from store.drain.messages import to_wire as drain_wire
from store.errors import InvalidParams
from store.events.publisher import KvEventPublisher
from store.master_state import MasterState
from store.objects import ClientStatus, ReplicaDescriptor, ReplicaList, ReplicaTier
from store.policy import StorePolicy
from store.reservations.messages import grant_to_wire
from store.tenants import DEFAULT_TENANT, check_tenant, scoped_key, scoped_keys
from store.wire import (batch_to_wire, bool_arg, config_from_wire, int_arg,
                        int_list_arg, reported_from_wire, segment_from_wire,
                        str_arg, str_list_arg)
from transfer import grants
from transfer.auth import ClusterSecret
from transfer.batch import OpCode
from transfer.errors import Unauthorized
from transfer.rpc.client_server import Request, RpcServer
from transfer.settings import Config

log = logging.getLogger(__name__)

# What a tenant's credential may ask of the master: its own keys' puts, gets and removals, and the
# segment descriptors its engine reads to reach the replicas it was handed.
TENANT_STORE_OPS = frozenset({
    "put_start", "upsert_start", "put_end", "put_revoke", "batch_put_start", "batch_upsert_start",
    "batch_put_end", "batch_put_revoke", "get_replica_list", "batch_get_replica_list", "exists",
    "batch_exists", "remove", "batch_remove", "remove_all", "inspect"})
TENANT_OPS = frozenset({f"store.{op}" for op in TENANT_STORE_OPS} | {"te.meta.get", "health"})
# inspect's views that show a tenant nothing but its own keys
TENANT_INSPECT = ("objects", "key")
# The ops whose replicas a tenant is granted, and for what
GRANTED_OPS = {"put_start": OpCode.WRITE, "upsert_start": OpCode.WRITE, "batch_put_start": OpCode.WRITE,
               "batch_upsert_start": OpCode.WRITE, "get_replica_list": OpCode.READ,
               "batch_get_replica_list": OpCode.READ}


class StoreService:
    def __init__(self, config: Config, publisher: KvEventPublisher | None = None,
                 secret: ClusterSecret | None = None) -> None:
        self.state = MasterState(StorePolicy.from_config(config))
        self.secret = secret  # signs tenants' grants (transfer.grants)
        self.max_batch_keys = config.store_max_batch_keys
        self.lock = threading.Lock()
        self.publisher = publisher  # None: events are recorded and dropped
        # A fresh state holds nothing: whoever followed an earlier one (a deposed or replaced
        # leader's, in this process) forgets what it listed.
        with self.lock:
            self.state.kv_events.cleared_since(0)
            self._hand_over_events()

    def register(self, server: RpcServer) -> None:
        for op, handler in self._ops().items():
            server.register(f"store.{op}", self._locked(op, handler))
        # It waits for the publisher's thread: off the I/O thread.
        server.register("store.kv_snapshot", self._kv_snapshot, blocking=True)

    def tick(self, now: float) -> None:
        with self.lock:
            self.state.release_quarantined(now)
            self.state.expire_reservations(now)
            evicted = self.state.evict(now)
            expired = self.state.expire_clients(now)
            self.state.expire_drains(now)
            self._hand_over_events()
        if evicted:
            log.info("evicted %d objects", len(evicted))
        for client_id in expired:
            log.warning("store client %s silent for the client TTL: dropped with its segments", client_id)

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {"store": views.counters_view(self.state)}

    def _locked(self, op: str, handler: Callable[[dict, float], Any]) -> Callable[[Request], Any]:
        granting = GRANTED_OPS.get(op)

        def run(request: Request) -> Any:
            if request.tenant is not None:
                _check_tenant_request(op, request)
            with self.lock:
                now = time.monotonic()
                try:
                    result = handler(request.args, now)
                    if request.tenant is not None and granting is not None and self.secret is not None:
                        # Under the lock: the ranges are quarantined before anyone can free them.
                        result = self._granted(result, granting, now)
                finally:  # an op that failed half way may have changed something
                    self._hand_over_events()
            return result
        return run

    def _granted(self, result: Any, opcode: OpCode, now: float) -> Any:
        """``result`` with a grant on each memory replica in it (any nesting of lists and maps:
        single and batch answers alike), each range kept from reuse while its grant is valid
        (store.grant_quarantine). A read's grant lasts its lease, a write's as long as a put may
        hold its range (store.policy)."""
        policy = self.state.policy
        lifetime = policy.lease_ttl if opcode == OpCode.READ else policy.put_start_discard_timeout
        expiry = time.time() + lifetime
        quarantine = self.state.quarantine

        def grant(value: Any) -> Any:
            if isinstance(value, ReplicaDescriptor):
                if value.tier != ReplicaTier.MEMORY.value:
                    return value
                quarantine.granted(value.segment_id, value.address, now + lifetime)
                return value._replace(grant=grants.issue(self.secret, value.segment_name, opcode,
                                                         value.address, value.size, expiry))
            if isinstance(value, ReplicaList):  # a named tuple: no list, no map
                return value._replace(replicas=[grant(r) for r in value.replicas])
            if isinstance(value, list):
                return [grant(v) for v in value]
            if isinstance(value, dict):
                return {k: grant(v) for k, v in value.items()}
            return value
        return grant(result)

    def _hand_over_events(self) -> None:
        """Under the lock: what the state recorded since the last call, to the publisher."""
        events = self.state.kv_events.take()
        if events and self.publisher is not None:
            self.publisher.publish(events)

    def _kv_events(self, args: dict, now: float) -> dict:
        p = self.publisher
        if p is None:
            return {"address": "", "replay_address": "", "epoch": "", "sequence": -1}
        return {"address": p.address, "replay_address": p.replay_address, "epoch": p.epoch,
                "sequence": p.last_sequence}

    def _kv_snapshot(self, request: Request) -> dict:
        with self.lock:
            self._hand_over_events()  # e.g. an op-log replay's, recorded outside any op
            blocks = [[obj.key, r.segment_id] for obj in self.state.objects.values() if obj.complete
                      for r in obj.replicas if r.in_memory]
            mark = self.publisher.mark() if self.publisher is not None else None
        info = self._kv_events(request.args, 0.0)
        return {**info, "sequence": mark.wait(timeout=5.0) if mark is not None else -1, "blocks": blocks}

    def _ops(self) -> dict[str, Callable[[dict, float], Any]]:
        s = self.state
        return {
            "put_start": lambda a, now: s.put_start(
                str_arg(a, "client_id"), self._key(a), int_arg(a, "size"), now,
                config_from_wire(a.get("config", {}))),
            "upsert_start": lambda a, now: s.upsert_start(
                str_arg(a, "client_id"), self._key(a), int_arg(a, "size"), now,
                config_from_wire(a.get("config", {}))),
            "put_end": lambda a, now: s.put_end(str_arg(a, "client_id"), self._key(a), now,
                                                a.get("checksum") if isinstance(a.get("checksum"), int) else None),
            "put_revoke": lambda a, now: s.put_revoke(str_arg(a, "client_id"), self._key(a), now),
            "batch_put_start": lambda a, now: batch_to_wire(s.batch_put_start(
                str_arg(a, "client_id"), self._keys(a), int_list_arg(a, "sizes"), now,
                config_from_wire(a.get("config", {})))),
            "batch_upsert_start": lambda a, now: batch_to_wire(s.batch_upsert_start(
                str_arg(a, "client_id"), self._keys(a), int_list_arg(a, "sizes"), now,
                config_from_wire(a.get("config", {})))),
            "batch_put_end": lambda a, now: batch_to_wire(s.batch_put_end(
                str_arg(a, "client_id"), self._keys(a), now, _checksums(a))),
            "batch_put_revoke": lambda a, now: batch_to_wire(s.batch_put_revoke(
                str_arg(a, "client_id"), self._keys(a), now)),
            "reserve_space": lambda a, now: grant_to_wire(s.reserve_space(
                str_arg(a, "client_id"), int_arg(a, "length"), now, config_from_wire(a.get("config", {})),
                int_list_arg(a, "release") if "release" in a else [])),
            "batch_put_commit": self._batch_put_commit,
            # A replica list packs as it is (store.wire.replica_list_from_wire).
            "get_replica_list": lambda a, now: s.get_replica_list(self._key(a), now),
            "batch_get_replica_list": lambda a, now: batch_to_wire(s.batch_get_replica_list(self._keys(a), now)),
            "exists": lambda a, now: s.exists(self._key(a)),
            "batch_exists": lambda a, now: s.batch_exists(self._keys(a)),
            "remove": lambda a, now: s.remove(self._key(a), now, bool_arg(a, "force")),
            "batch_remove": lambda a, now: batch_to_wire(
                s.batch_remove(self._keys(a), now, bool_arg(a, "force"))),
            "remove_all": lambda a, now: s.remove_all(now, bool_arg(a, "force"), _tenant(a)),
            "mount_segment": lambda a, now: s.mount_segment(
                str_arg(a, "client_id"), segment_from_wire(a.get("segment")), now),
            "unmount_segment": lambda a, now: s.unmount_segment(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), now),
            "add_disk_replica": lambda a, now: s.add_disk_replica(
                str_arg(a, "client_id"), str_arg(a, "key"), str_arg(a, "segment_id"),
                int_arg(a, "address"), int_arg(a, "checksum"), now),
            "promote_start": lambda a, now: s.promote_start(
                str_arg(a, "client_id"), self._key(a), now, str_arg(a, "host", "")),
            "promote_end": lambda a, now: s.promote_end(str_arg(a, "client_id"), self._key(a), now),
            "promote_revoke": lambda a, now: s.promote_revoke(str_arg(a, "client_id"), self._key(a), now),
            "copy_start": lambda a, now: s.copy_start(
                str_arg(a, "client_id"), self._key(a), str_list_arg(a, "segment_ids"), now),
            "copy_end": lambda a, now: s.copy_end(
                str_arg(a, "client_id"), self._key(a), now, str_arg(a, "drop_segment", "")),
            "copy_revoke": lambda a, now: s.copy_revoke(str_arg(a, "client_id"), self._key(a), now),
            "remount": self._remount,
            "ping": self._ping,
            "inspect": self._inspect,
            "set_tenant_quota": lambda a, now: self._set_tenant_quota(a),
            "kv_events": self._kv_events,
            **self._drain_ops(),
        }

    def _batch_put_commit(self, args: dict, now: float) -> dict:
        keys = self._keys(args)
        checksums = _checksums(args)
        results, grant = self.state.batch_put_commit(
            str_arg(args, "client_id"), int_arg(args, "reservation"), keys, int_list_arg(args, "offsets"),
            int_list_arg(args, "sizes"), [None] * len(keys) if checksums is None else checksums, now,
            config_from_wire(args["config"]) if "config" in args else None,
            int_arg(args, "consumed") if args.get("consumed") is not None else None, int_arg(args, "reserve", 0),
            int_list_arg(args, "release") if "release" in args else [])
        return {"results": batch_to_wire(results), "reservation": grant_to_wire(grant)}

    def _drain_ops(self) -> dict[str, Callable[[dict, float], Any]]:
        s = self.state
        return {
            "drain_start": lambda a, now: drain_wire(s.drain_start(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), now)),
            "drain_pending": lambda a, now: drain_wire(s.drain_pending(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), now,
                max(1, min(int_arg(a, "limit"), self.max_batch_keys)), self._drain_skip(a))),
            "drain_move_start": lambda a, now: s.drain_move_start(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), str_arg(a, "key"), now),
            "drain_finish": lambda a, now: drain_wire(s.drain_finish(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), now)),
            "drain_cancel": lambda a, now: s.drain_cancel(str_arg(a, "client_id"), str_arg(a, "segment_id"), now),
            "drain_status": lambda a, now: drain_wire(s.drain_status(
                str_arg(a, "client_id"), str_arg(a, "segment_id"), now)),
        }

    def _drain_skip(self, args: dict) -> list[str]:
        """drain_pending's keys to leave out, bounded like a batch's keys (the op holds the lock)."""
        skip = str_list_arg(args, "skip") if "skip" in args else []
        if len(skip) > self.max_batch_keys:
            raise InvalidParams(f"a skip list of {len(skip)} keys exceeds store_max_batch_keys ({self.max_batch_keys})")
        return skip

    def _key(self, args: dict) -> str:
        """The request's key, scoped by its tenant (store.tenants)."""
        return scoped_key(_tenant(args), str_arg(args, "key"))

    def _keys(self, args: dict) -> list[str]:
        tenant = _tenant(args)
        return scoped_keys(tenant, self._batch_keys(args))

    def _batch_keys(self, args: dict) -> list[str]:
        """A batch op's keys, refused beyond ``store_max_batch_keys``: the ops run under the store
        lock on the I/O thread, so one huge batch would hold every other client (and their pings,
        which keep them alive) for as long as it takes."""
        keys = args.get("keys")
        if isinstance(keys, list) and len(keys) > self.max_batch_keys:
            raise InvalidParams(f"a batch of {len(keys)} keys exceeds the limit of {self.max_batch_keys} "
                                "(store_max_batch_keys): split it")
        return str_list_arg(args, "keys")

    def _remount(self, args: dict, now: float) -> dict:
        segments = args.get("segments")
        objects = args.get("objects")
        if not isinstance(segments, list) or not isinstance(objects, list):
            raise InvalidParams("remount needs lists 'segments' and 'objects'")
        disk_objects = args.get("disk_objects", [])
        if not isinstance(disk_objects, list):
            raise InvalidParams("remount's 'disk_objects' must be a list")
        return self.state.remount(str_arg(args, "client_id"), [segment_from_wire(s) for s in segments],
                                  [reported_from_wire(o) for o in objects], now,
                                  [reported_from_wire(o) for o in disk_objects])

    def _ping(self, args: dict, now: float) -> dict:
        client_id = str_arg(args, "client_id")
        status = self.state.ping(client_id, now)
        acks = args.get("acks", {})
        if not isinstance(acks, dict):
            raise InvalidParams("acks must be a map of segment id to sequence number")
        if status is ClientStatus.NEED_REMOUNT:
            # Its acks count another master's journal: trimming ours by them would drop changes
            # (those of a replayed op log) the client has not seen. It restarts at 0 on remount.
            return {"status": status.value, "changes": {}}
        client = self.state.clients[client_id]
        changes = {}
        for segment_id in client.segment_ids:
            acked = acks.get(segment_id, 0)
            acked = acked if isinstance(acked, int) else 0
            changes[segment_id] = self.state.journal.since(segment_id, acked)  # packed as arrays
        return {"status": status.value, "changes": changes,
                "unmount": self.state.segments_to_unmount(client_id, now)}

    def _inspect(self, args: dict, now: float) -> Any:
        what = str_arg(args, "what", "counters")
        if what == "counters":
            return views.counters_view(self.state)
        if what == "segments":
            return views.segments_view(self.state)
        if what == "objects":
            return views.objects_view(self.state, now, _tenant(args))
        if what == "clients":
            return views.clients_view(self.state, now)
        if what == "key":
            return views.object_view(self.state, self._key(args), now)
        if what == "tenants":
            return views.tenants_view(self.state)
        raise InvalidParams(f"inspect what={what!r}: expected counters, segments, objects, clients, key "
                            "or tenants")

    def _set_tenant_quota(self, args: dict) -> dict:
        tenant = check_tenant(str_arg(args, "tenant"))
        self.state.set_tenant_quota(tenant, int_arg(args, "quota"))
        log.info("tenant %s: quota set to %d bytes", tenant, self.state.tenants.quota(tenant))
        return views.tenant_row(self.state, tenant)


def _check_tenant_request(op: str, request: Request) -> None:
    """Unauthorized unless a request that came with ``request.tenant``'s credential acts for that
    tenant alone (the RPC server already refused ops outside TENANT_OPS)."""
    named = request.args.get("tenant", DEFAULT_TENANT)
    if named != request.tenant:
        raise Unauthorized(f"store.{op}: this client holds the credential of tenant {request.tenant!r}, "
                           f"which reaches no keys of tenant {named!r:.200}")
    if op == "inspect" and request.args.get("what", "counters") not in TENANT_INSPECT:
        raise Unauthorized(f"store.inspect: a tenant's credential may inspect its own "
                           f"{' and '.join(TENANT_INSPECT)} only")


def _tenant(args: dict) -> str:
    """The tenant a request acts for; none named: the default one (clients that predate tenants)."""
    return check_tenant(str_arg(args, "tenant", DEFAULT_TENANT))


def _checksums(args: dict) -> list[int | None] | None:
    values = args.get("checksums")
    if values is None:
        return None
    if not isinstance(values, list):
        raise InvalidParams("checksums must be a list")
    if all(type(v) is int for v in values):  # one pass, no call per key: the common case
        return values
    return [v if isinstance(v, int) and not isinstance(v, bool) else None for v in values]
