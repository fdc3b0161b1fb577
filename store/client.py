"""The store's library client: put and get objects, moving the bytes itself.

    client = StoreClient("tcp://127.0.0.1:5555", config)
    client.put("k", b"bytes")                 # PutStart -> WRITE to every replica -> PutEnd
    client.get("k")                           # GetReplicaList (lease) -> READ -> verify
    address = client.register_buffer(array)   # then put_from / get_into copy no extra time

The master only hands out where replicas live; every byte moves between this process's
registered memory and the replicas' segments: copied by this process itself when it can map the
segment (its own, or another process's on this host, through shared memory), checksummed on the
way (:mod:`store.segment_copy`); through the transfer engine otherwise (TCP, RDMA, GPU memory).
A put is acknowledged only after every replica was written and the master marked it complete;
any failure in between revokes it. A get verifies the object's checksum (xxh3-64, taken at put)
and refuses bytes whose read lease ran out before the copy finished (LeaseExpired): after the
lease the range may already hold another object.

With ``segment_size > 0`` the client also contributes a segment (see :mod:`store.segment_owner`)
and pings the master from a thread, unless ``heartbeat=False`` (the store-client daemon pings
from its own loop).
"""

from __future__ import annotations

import mmap
import threading
import time
import uuid
from typing import Any

import xxhash

from store.disk_reader import DiskReader
from store.held_leases import HeldLeases
from store.errors import ChecksumMismatch, InvalidParams, LeaseExpired, MooncakeError, ObjectNotFound
from store.master_client import MasterClient
from store.objects import ReplicaDescriptor, ReplicaList, ReplicateConfig, ReplicaTier, tuple_of
from store.replica_mover import Move, ReplicaMover
from store.reservations.holder import GRANT_BYTES, HeldGrant, ReservationHolder
from store.reservations.state import MAX_RESERVATION_BYTES
from store.segment_owner import SegmentOwner
from store.stats import ClientStats
from transfer.auth import client_credential
from store.tenants import scoped_key
from transfer.batch import OpCode
from transfer.from_settings import open_engine
from transfer.memory import copy_into
from transfer.settings import Config, resolve


_MEMORY = ReplicaTier.MEMORY.value  # a descriptor's tier, compared per replica read
# Replica lists kept for reuse (store.held_leases): ~20 MB at most (314 B each, tracemalloc),
# beside a set of up to 4x as many keys read once (8 MiB for 262,144, plus their strings).
HELD_LEASES = 1 << 16


def checksum_of(view: Any) -> int:
    return xxhash.xxh3_64_intdigest(view)


class StoreClient:
    def __init__(self, master_address: str, config: Config | None = None, *, segment_size: int = 0,
                 heartbeat: bool = True, topology: dict | None = None, shm_prefix: str | None = None,
                 client_id: str | None = None) -> None:
        self.config = config or resolve()
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        credential = client_credential(self.config)
        self.master = MasterClient(master_address, self.client_id, self.config.rpc_timeout,
                                   self.config.rpc_busy_poll, self.config.store_max_batch_keys,
                                   credential, self.config.tenant)
        try:
            self.engine = open_engine(self.client_id, master_address, self.config, topology=topology,
                                      shm_prefix=shm_prefix)
        except BaseException:
            self.master.close()  # the master may be unreachable: this constructor still owns its client
            raise
        self.owner: SegmentOwner | None = None
        self.disk = DiskReader(self.engine, self.config.rpc_timeout)
        self._local = threading.local()  # per-thread staging buffer for put() of plain bytes
        self.stats = ClientStats()
        self.held_leases = HeldLeases(HELD_LEASES)
        # A tenant's credential may not reserve (store.master_service): its puts go the plain way.
        self.reservations = ReservationHolder() if self.config.put_reservations and (
            credential is None or credential.tenant is None) else None
        self._stop = threading.Event()
        self._pinger: threading.Thread | None = None
        try:
            if segment_size:
                self.owner = SegmentOwner(self.engine, self.master, segment_size,
                                          str(self.config.offload_dir or ""), self.config.bind_host,
                                          self.config.offload_policy, self.config.segment_prefault)
                if heartbeat:
                    self._pinger = threading.Thread(target=self._ping_loop, daemon=True, name="store-ping")
                    self._pinger.start()
        except BaseException:
            self.engine.close()
            self.master.close()
            raise
        self.mover = ReplicaMover(self.engine, self.owner, self.config.shm_copy_threads)

    def close(self) -> None:
        """Stop pinging, unmount our segment (its objects go), release the engine."""
        self._stop.set()
        if self._pinger is not None:
            self._pinger.join(timeout=5)
        try:
            self.release_reservations()
        except MooncakeError:
            pass  # the master expires them
        if self.owner is not None:
            try:
                self.owner.unmount()
            except MooncakeError:
                pass  # the master is gone or already dropped us; the TTL cleans up
        self.disk.close()
        self.mover.close()
        self.engine.close()
        self.master.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _ping_loop(self) -> None:
        interval = self.config.ping_interval
        while not self._stop.wait(interval):
            self.owner.heartbeat(timeout=max(interval, 0.5))

    # -- memory ---------------------------------------------------------------------------------
    def register_buffer(self, buffer: Any, location: str = "cpu:0") -> int:
        """Register memory for put_from/get_into; returns its address (transfer.memory.address_of)."""
        return self.engine.register_local_memory(buffer, location, remote_accessible=False,
                                                 update_metadata=False)

    def unregister_buffer(self, buffer_or_address: Any) -> None:
        self.engine.unregister_local_memory(buffer_or_address, update_metadata=False)

    def _staging(self, size: int) -> tuple[memoryview, int]:
        held = getattr(self._local, "staging", None)
        if held is None or held[0].nbytes < size:
            if held is not None:
                self.unregister_buffer(held[1])
            # Anonymous pages, not numpy: no up-front fill, and a small put imports no numpy.
            view = memoryview(mmap.mmap(-1, max(size, 1 << 16)))
            held = self._local.staging = (view, self.register_buffer(view))
        return held

    # -- puts -----------------------------------------------------------------------------------
    def replicate_config(self, replicas: int | None = None, soft_pin: bool = False,
                         soft_pin_ttl: float | None = None, hard_pin: bool = False,
                         preferred_segments: tuple[str, ...] = ()) -> ReplicateConfig:
        return ReplicateConfig(replicas or self.config.replicas, soft_pin, soft_pin_ttl, hard_pin,
                               tuple(preferred_segments), host=self.engine.host_id)

    def put(self, key: str, value: Any, *, upsert: bool = False, **replication: Any) -> None:
        """Store ``value`` (any bytes-like object) under ``key``. ObjectAlreadyExists if taken
        (use ``upsert=True`` to overwrite)."""
        source = memoryview(value).cast("B")
        staging, address = self._staging(source.nbytes)
        copy_into(staging[:source.nbytes], source)
        self.put_from(key, address, source.nbytes, upsert=upsert, **replication)

    def put_from(self, key: str, address: int, size: int, *, upsert: bool = False,
                 **replication: Any) -> None:
        """Store ``size`` bytes of registered memory at ``address`` with no staging copy."""
        result = self.batch_put_from([key], [address], [size], upsert=upsert, **replication)[0]
        if isinstance(result, MooncakeError):
            raise result

    def batch_put(self, keys: list[str], values: list[Any], **kwargs: Any) -> list[MooncakeError | None]:
        """Per key None (stored) or its error; values are staged in one buffer, moved in one batch."""
        views = [memoryview(v).cast("B") for v in values]
        staging, address = self._staging(sum(v.nbytes for v in views))
        addresses, offset = [], 0
        for view in views:
            copy_into(staging[offset:offset + view.nbytes], view)
            addresses.append(address + offset)
            offset += view.nbytes
        return self.batch_put_from(keys, addresses, [v.nbytes for v in views], **kwargs)

    def batch_put_from(self, keys: list[str], addresses: list[int], sizes: list[int], *,
                       upsert: bool = False, **replication: Any) -> list[MooncakeError | None]:
        if not len(keys) == len(addresses) == len(sizes):
            raise InvalidParams("keys, addresses and sizes must have the same length")
        # AddressNotRegistered before the master allocates anything.
        views = self.engine.host_views(addresses, [max(n, 1) for n in sizes])
        checksummed = self.config.checksum
        config = self.replicate_config(**replication)
        if self.reservations is not None and not upsert:
            reserved = self._put_reserved(keys, addresses, sizes, views, config)
            if reserved is not None:
                self.stats.record_puts(sizes, reserved)
                return reserved
        started = self.master.batch_put_start(keys, sizes, config, upsert)
        results: list[MooncakeError | None] = [r if isinstance(r, MooncakeError) else None for r in started]
        writes = [(i, replica) for i, r in enumerate(started) if not isinstance(r, MooncakeError) for replica in r]
        failed, digests = self.mover.move(OpCode.WRITE, [(addresses[i], r, sizes[i]) for i, r in writes],
                                         checksummed, [views[i] for i, _ in writes])
        checksums: list[int | None] = [None] * len(keys)
        for (i, _), error, digest in zip(writes, failed, digests):
            if error is not None and results[i] is None:
                results[i] = error
            if digest is not None:  # hashed on the way, or while the engine moved it (store.replica_mover)
                checksums[i] = digest
        done = [i for i, r in enumerate(started) if not isinstance(r, MooncakeError) and results[i] is None]
        self._checksum_rest(done, checksums, addresses, sizes, views)
        undo = [i for i, r in enumerate(started) if not isinstance(r, MooncakeError) and results[i] is not None]
        if undo:
            self.master.batch_put_revoke([keys[i] for i in undo])
        if done:
            for i, outcome in zip(done, self.master.batch_put_end([keys[i] for i in done],
                                                                  [checksums[i] for i in done])):
                results[i] = outcome
        self.stats.record_puts(sizes, results)
        return results

    def release_reservations(self) -> None:
        """Give back the put reservations this client holds (store.reservations): a benchmark
        that leaves the pool as it found it, or a client that stops putting for a while."""
        unused = self.reservations.take_all() if self.reservations is not None else []
        if unused:
            self.master.reserve_space(0, ReplicateConfig(), unused)

    def _put_reserved(self, keys: list[str], addresses: list[int], sizes: list[int], views: list,
                      config: ReplicateConfig) -> list[MooncakeError | None] | None:
        """batch_put_from in one master round trip, through a put reservation
        (store.reservations); None where none applies, or the one used was gone: then the plain
        way, which writes the objects again."""
        holder = self.reservations
        offsets, length = holder.layout(sizes, holder.alignment)
        if config.replica_num != 1 or not 0 < length <= MAX_RESERVATION_BYTES or 0 in sizes \
                or len(keys) > (self.master.max_batch_keys or len(keys)):
            return None
        now = time.monotonic()
        held, stale = holder.take(config, length, now)
        if held is None:
            if not holder.may_ask(now):
                # What take() dropped expires at the master (put_start_discard_timeout).
                return None
            grant = self.master.reserve_space(max(length, GRANT_BYTES), config, stale)
            if grant is None:
                holder.refused(now)
                return None
            stale = []
            held = HeldGrant(grant, config, now)
            if grant.alignment != holder.alignment:
                offsets, length = holder.layout(sizes, grant.alignment)
            if length > held.room:
                holder.keep(held)  # for a smaller put, or released once stale
                return None
        segment_id, segment_name, endpoint, host, address, _, tier, grant_token = held.grant.replica
        start = address + held.used
        # Built field by field: the named tuple's _replace took 26 us per 32 objects, this 5.4.
        replicas = [tuple_of(ReplicaDescriptor, (segment_id, segment_name, endpoint, host, start + offset, size,
                                                 tier, grant_token))
                    for offset, size in zip(offsets, sizes)]
        checksummed = self.config.checksum
        failed, digests = self.mover.move(OpCode.WRITE, list(zip(addresses, replicas, sizes)), checksummed, views)
        results: list[MooncakeError | None] = list(failed)
        checksums: list[int | None] = list(digests)
        done = [i for i, error in enumerate(failed) if error is None]
        self._checksum_rest(done, checksums, addresses, sizes, views)
        # The last put the grant has room for asks for the next one in its commit.
        reserve = max(length, GRANT_BYTES) if held.room - length < length else 0
        asked_at = time.monotonic()
        try:
            outcomes, grant = self.master.batch_put_commit(
                held.grant.reservation_id, [keys[i] for i in done], [offsets[i] for i in done],
                [sizes[i] for i in done], [checksums[i] for i in done], consumed=length,
                reserve=reserve, release=stale)
        except ObjectNotFound:
            return None  # expired, or its segment left: nothing was published
        if grant is not None:
            holder.keep(HeldGrant(grant, config, asked_at))
        elif not reserve and held.room > length:
            holder.keep(held.after(length))
        for i, outcome in zip(done, outcomes):
            results[i] = outcome
        return results

    def _checksum_rest(self, done: list[int], checksums: list[int | None], addresses: list[int],
                       sizes: list[int], views: list) -> None:
        """Fill in the checksums of the objects ``done`` that were not hashed on the way."""
        if not self.config.checksum:
            return
        for i in done:
            if checksums[i] is None and sizes[i] > 0:  # a view of n > 0 is n long
                checksums[i] = checksum_of(views[i] if views[i] is not None
                                           else self.engine.buffer_at(addresses[i], sizes[i]))

    # -- gets -----------------------------------------------------------------------------------
    def get(self, key: str) -> bytearray:
        result = self.batch_get([key])[0]
        if isinstance(result, MooncakeError):
            raise result
        return result

    def get_into(self, key: str, address: int, capacity: int) -> int:
        """Read the object into registered memory at ``address``; returns its size."""
        result = self.batch_get_into([key], [address], [capacity])[0]
        if isinstance(result, MooncakeError):
            raise result
        return result

    def batch_get(self, keys: list[str]) -> list[bytearray | MooncakeError]:
        buffers: dict[int, bytearray] = {}

        def read(indexes: list[int], lists: list, asked: list[float]) -> list[int | MooncakeError]:
            targets: dict[int, bytearray] = {}
            for n, (i, item) in enumerate(zip(indexes, lists)):
                if not isinstance(item, MooncakeError):
                    targets[n] = buffers[i] = bytearray(item.size)
            addresses = {n: self.register_buffer(b) for n, b in targets.items() if len(b)}
            try:
                return self._read(lists, {n: (addresses[n], len(targets[n])) for n in addresses}, asked)
            finally:
                for address in addresses.values():
                    self.unregister_buffer(address)

        results = self._get(keys, read)
        return [s if isinstance(s, MooncakeError) else buffers[i] for i, s in enumerate(results)]

    def batch_get_into(self, keys: list[str], addresses: list[int], capacities: list[int],
                       segments: list[str | None] | None = None) -> list[int | MooncakeError]:
        """``segments``: per key the segment id to read it from, None for any replica; a key
        with no replica on its segment fails with ObjectNotFound (a prefill worker reading its
        own cache, or pulling a prefix from the instance the conductor chose)."""

        def read(indexes: list[int], lists: list, asked: list[float]) -> list[int | MooncakeError]:
            if segments is not None:
                lists = [_on_segment(item, segments[i]) for i, item in zip(indexes, lists)]
            return self._read(lists, {n: (addresses[i], capacities[i]) for n, i in enumerate(indexes)}, asked)

        return self._get(keys, read)

    def _get(self, keys: list[str], read) -> list[int | MooncakeError]:
        """Find each key's replicas (reusing a lease this client still holds: store.held_leases,
        else asking the master) and ``read(indexes, replica lists, when each lease was asked
        for)``; a read through a reused lease that failed is asked of the master and read again."""
        now = time.monotonic()
        # Only a client that verifies what it reads may skip the master: see store.held_leases.
        reusing = self.config.reuse_read_leases and self.config.checksum
        held = self.held_leases.reusable(keys, now) if reusing else [None] * len(keys)
        reused = [i for i, entry in enumerate(held) if entry is not None]
        lists: list = [None] * len(keys)
        asked = [now] * len(keys)
        for i in reused:
            lists[i], asked[i] = held[i]  # type: ignore[misc]
        missing = [i for i, entry in enumerate(held) if entry is None]
        if missing:
            answers = self.master.batch_get_replica_list(keys if not reused else [keys[i] for i in missing])
            for i, item in zip(missing, answers):
                lists[i] = item
        results = read(list(range(len(keys))), lists, asked)
        again = [i for i in reused if isinstance(results[i], MooncakeError)]
        if again:  # not where the held list says (removed by force, moved, segment gone): ask
            self.held_leases.forget([keys[i] for i in again])
            retried = time.monotonic()
            answers = self.master.batch_get_replica_list([keys[i] for i in again])
            for i, item, result in zip(again, answers, read(again, answers, [retried] * len(again))):
                lists[i], asked[i], results[i] = item, retried, result
            reused = sorted(set(reused).difference(again))
        if reusing:
            fresh = set(range(len(keys))).difference(reused)
            self.held_leases.hold([(keys[i], lists[i], asked[i]) for i in fresh
                                   if not isinstance(results[i], MooncakeError)], time.monotonic(),
                                  first_read=len(keys) == 1)
        self.stats.record_gets(results, len(reused))
        return results

    def _read(self, lists: list, targets: dict[int, tuple[int, int]],
              asked: list[float]) -> list[int | MooncakeError]:
        """Read each found object from its best replica, falling back replica by replica;
        ``asked``: per object when its lease was asked for."""
        results: list[int | MooncakeError] = []
        pending: dict[int, list[ReplicaDescriptor]] = {}  # per object still to read, its replicas left
        for i, item in enumerate(lists):
            if isinstance(item, MooncakeError):
                results.append(item)
            elif item.size > targets[i][1]:
                results.append(InvalidParams(f"{item.key!r} has {item.size} bytes; the buffer holds {targets[i][1]}"))
            else:
                results.append(item.size)
                pending[i] = self._ordered(item.replicas)
        checksummed = self.config.checksum
        while pending:
            attempt = [(i, replicas.pop(0)) for i, replicas in pending.items()]
            in_memory = [(i, r) for i, r in attempt if r.tier == _MEMORY]
            failed, digests = self.mover.move(
                OpCode.READ, [(targets[i][0], r, lists[i].size) for i, r in in_memory], checksummed)
            copied = time.monotonic()  # every in-memory copy of this round finished by now
            for (i, _), error, digest in zip(in_memory, failed, digests):
                if error is None:
                    error = self._verify(lists[i], targets[i][0], asked[i], copied, digest, checksummed)
                if error is None:  # read: its result is its size already
                    del pending[i]
                else:
                    self._settle(i, error, lists, pending, results)
            if len(in_memory) == len(attempt):
                continue  # nothing on disk this round
            for i, replica in attempt:
                if replica.tier != _MEMORY:
                    error = self.disk.read(scoped_key(self.master.tenant, lists[i].key), replica, targets[i][0])
                    if error is None:
                        error = self._verify(lists[i], targets[i][0], asked[i], time.monotonic(), None, checksummed)
                    if error is None and lists[i].promote:
                        self._promote(lists[i], targets[i][0])
                    self._settle(i, error, lists, pending, results)
        return results

    @staticmethod
    def _settle(i: int, error: MooncakeError | None, lists: list, pending: dict[int, list],
                results: list) -> None:
        """Object ``i`` was read (``error`` None) or failed on a replica: done unless another
        replica is left to try."""
        if error is None or not pending[i]:
            results[i] = lists[i].size if error is None else error
            del pending[i]

    def _promote(self, replicas: ReplicaList, address: int) -> None:
        """Copy an object just read from disk back into memory (best effort: it stays on disk)."""
        try:
            replica = self.master.promote_start(replicas.key, self.engine.host_id)
        except MooncakeError:
            return  # no room, or another reader promotes it
        error = self._move(OpCode.WRITE, [(address, replica, replicas.size)])[0]
        try:
            if error is None:
                self.master.promote_end(replicas.key)
            else:
                self.master.promote_revoke(replicas.key)
        except MooncakeError:
            pass  # removed, or its segment went meanwhile: nothing to finish

    def _verify(self, replicas: ReplicaList, address: int, asked: float, finished: float,
                digest: int | None, checksummed: bool) -> MooncakeError | None:
        """``asked``: when the lease was asked for; ``finished``: when the copy had finished;
        ``digest``: the checksum of the bytes read if it was taken already; ``checksummed``:
        whether this client checks them (the checksum setting, looked up once per batch)."""
        if finished > asked + replicas.lease_ttl:
            return LeaseExpired(f"the lease on {replicas.key!r} ran out before the copy finished")
        if checksummed and replicas.checksum is not None:
            if digest is None:
                digest = checksum_of(self.engine.buffer_at(address, replicas.size))
            if digest != replicas.checksum:
                return ChecksumMismatch(f"{replicas.key!r}: the bytes read differ from those put")
        return None

    def _ordered(self, replicas: list[ReplicaDescriptor]) -> list[ReplicaDescriptor]:
        """Memory before disk; this host's first (a shared-memory copy), then in master order."""
        if len(replicas) == 1:  # the common case, per key of a batch: nothing to order
            return list(replicas)
        return sorted(replicas, key=lambda r: (r.tier != _MEMORY, r.host != self.engine.host_id))

    def _move(self, opcode: OpCode, moves: list[Move]) -> list[MooncakeError | None]:
        """Per move (local address, replica, size) None or the error that ended it."""
        return self.mover.move(opcode, moves, False)[0]

    def move_ranges(self, opcode: OpCode,
                    ranges: list[tuple[int, ReplicaDescriptor, int, int]]) -> list[MooncakeError | None]:
        """One engine batch of (local address, replica, offset into the object, size); per range
        None or its error. For callers that hold replicas from a put start or a replica list
        and move parts of an object (compat's put and get sessions)."""
        return self._move(opcode, [(address, replica._replace(address=replica.address + offset), size)
                                   for address, replica, offset, size in ranges])

    # -- replica copies -------------------------------------------------------------------------
    def copy_replicas(self, key: str, segment_ids: list[str], drop_segment: str = "") -> None:
        """Give ``key`` a replica on each of ``segment_ids`` (see :mod:`store.replication`); with
        ``drop_segment``, drop its replica there in the same step (a move). The bytes pass through
        a buffer of this client: read from one source replica, written to every new one."""
        sources, targets, checksum = self.master.copy_start(key, segment_ids)
        self._end_copy(key, sources, targets, checksum, drop_segment)

    def move_off(self, key: str, segment_id: str) -> int:
        """Move ``key`` off draining ``segment_id`` to a segment the master picks (see
        :mod:`store.drain.state`), the bytes passing through this client as in copy_replicas.
        Returns the bytes moved."""
        sources, targets, checksum = self.master.drain_move_start(segment_id, key)
        self._end_copy(key, sources, targets, checksum, segment_id)
        return targets[0].size if targets else 0

    def _end_copy(self, key: str, sources: list[ReplicaDescriptor], targets: list[ReplicaDescriptor],
                  checksum: int | None, drop_segment: str) -> None:
        """Write a started copy's targets and end it, or revoke it on any failure."""
        self.held_leases.forget([key])  # its replicas change: the next get asks where they are
        try:
            if targets:
                error = self._copy_through(sources, targets, checksum)
                if error is not None:
                    raise error
            self.master.copy_end(key, drop_segment)
        except BaseException:
            try:
                self.master.copy_revoke(key)
            except MooncakeError:
                pass  # the master abandoned it already (a source or target went)
            raise

    def batch_copy_from(self, keys: list[str], addresses: list[int], sizes: list[int],
                        segment_id: str) -> list[MooncakeError | None]:
        """Give each complete object a replica on ``segment_id``, writing it from registered
        memory that already holds its bytes (a prefill worker keeping a prefix it pulled or
        recomputed: no second read). Per key None (it has a replica there now, maybe from
        before) or the error that stopped it; ChecksumMismatch when the memory differs from the
        object. Each copy is the master's copy_start/copy_end, so it is a real replica."""
        if not len(keys) == len(addresses) == len(sizes):
            raise InvalidParams("keys, addresses and sizes must have the same length")
        self.held_leases.forget(keys)  # their replicas change: the next get asks where they are
        return [self._copy_from(key, address, size, segment_id)
                for key, address, size in zip(keys, addresses, sizes)]

    def _copy_from(self, key: str, address: int, size: int, segment_id: str) -> MooncakeError | None:
        try:
            view = self.engine.buffer_at(address, max(size, 1))
            _, targets, checksum = self.master.copy_start(key, [segment_id])
        except MooncakeError as exc:
            return exc
        try:
            error = None
            if targets and targets[0].size != size:
                error = InvalidParams(f"{key!r} has {targets[0].size} bytes, the memory {size}")
            elif targets and self.config.checksum and checksum is not None and checksum_of(view[:size]) != checksum:
                error = ChecksumMismatch(f"the memory to copy {key!r} from differs from the object")
            elif targets:
                error = next((e for e in self._move(OpCode.WRITE, [(address, t, size) for t in targets])
                              if e is not None), None)
            if error is None:
                self.master.copy_end(key)
                return None
        except MooncakeError as exc:
            error = exc
        try:
            self.master.copy_revoke(key)
        except MooncakeError:
            pass  # the master abandoned it already (a source or target went)
        return error

    def _copy_through(self, sources: list[ReplicaDescriptor], targets: list[ReplicaDescriptor],
                      checksum: int | None) -> MooncakeError | None:
        import numpy as np  # only here: a store client that copies no replicas needs none of it

        size = targets[0].size
        array = np.empty(size, dtype=np.uint8)
        address = self.register_buffer(array)
        try:
            error: MooncakeError | None = None
            for source in self._ordered(sources):
                error = self._move(OpCode.READ, [(address, source, size)])[0]
                if error is None and self.config.checksum and checksum is not None \
                        and checksum_of(array) != checksum:
                    error = ChecksumMismatch(f"the bytes read from {source.segment_name} differ from those put")
                if error is None:
                    break
            if error is not None:
                return error
            written = self._move(OpCode.WRITE, [(address, target, size) for target in targets])
            return next((e for e in written if e is not None), None)
        finally:
            self.unregister_buffer(address)

    # -- the rest -------------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.master.exists(key)

    def batch_exists(self, keys: list[str]) -> list[bool]:
        return self.master.batch_exists(keys)

    def remove(self, key: str, force: bool = False) -> None:
        self.held_leases.forget([key])
        self.master.remove(key, force)

    def batch_remove(self, keys: list[str], force: bool = False) -> list:
        self.held_leases.forget(keys)
        return self.master.batch_remove(keys, force)

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this client's tenant (leased ones only when forced)."""
        self.held_leases.clear()
        return self.master.remove_all(force)

    def get_replicas(self, key: str) -> ReplicaList:
        """Where ``key`` lives; like a get, this takes a read lease on it."""
        return self.master.get_replica_list(key)


def _on_segment(item: ReplicaList | MooncakeError, segment_id: str | None) -> ReplicaList | MooncakeError:
    """``item`` with only its replicas on ``segment_id`` (all of them for None)."""
    if segment_id is None or isinstance(item, MooncakeError):
        return item
    replicas = [r for r in item.replicas if r.segment_id == segment_id]
    if not replicas:
        return ObjectNotFound(f"{item.key!r} has no replica on segment {segment_id!r}")
    return item._replace(replicas=replicas)

