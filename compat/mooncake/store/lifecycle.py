"""Setting the store up and tearing it down, and the helpers every call goes through.

``setup`` builds one of our :class:`store.client.StoreClient` s: it connects to our master at
``master_server_addr`` and, when ``global_segment_size`` > 0, contributes a segment of that
size (Mooncake's "embedded" mode). ``setup_dummy`` builds one with no segment, using the pool
that store-client daemons contribute (Mooncake's standalone mode, where a separate real client
owns the pool). ``server_address`` is that real client's address, as in the original (compat's
``mooncake_client`` serves on its ``--port``, 50052 by default, and names its master when
asked), or our master's own.

``metadata_server`` is checked but, whatever it names, segment descriptors go through the
master: every store client of the cluster, daemons included, publishes there, so that is the
one place all of them find each other. ``local_buffer_size`` bounds the values the copying
calls (put, put_batch, put_parts, upsert*, the tensor puts) take, as the original's local buffer
does: a larger value, or any with 0, is refused with INVALID_PARAMS; our client stages them in
a per-thread buffer it sizes itself. A store dropped without ``close`` is closed when it is
collected, and only then is its port (its name) free again. ``engine`` (a
TransferEngine to share) is accepted for the signature; our client keeps its own. So are
SGLang's SSD offload and client HTTP server keywords, which the original added later: SGLang
passes them when setup takes them, and our SSD tier is a master setting. ``tenant_id`` (also a
key of ``setup(dict)``) is honoured: every call of the store acts on that tenant's keys and
counts against its quota, as in the original. Given a tenant credential in the environment
(``MOONCAKE_TENANT_CREDENTIAL``, see ``mooncake tenant credential``) instead of the cluster
secret, the store acts for the credential's tenant alone (``tenant_id`` may be left out; another
one fails the setup), contributes no segment (``global_segment_size`` 0) and moves its bytes
over TCP.
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from mooncake._codes import INVALID_PARAMS, code_of, log, logged
from mooncake._setup_args import (CLIENT_ID_SEPARATOR, P2P, SetupError, bind_address, check_metadata_server,
                                  engine_protocol, hostname_of, master_address, parse_size, reserve_port,
                                  split_hostname)
from mooncake.store.buffers import MemoryPool
from store.client import StoreClient
from store.errors import ObjectAlreadyExists
from transfer.auth import cluster_secret
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import resolve

DEFAULT_SIZE = 16 * 2**20
HAS_LEASE = -706
UPSERT_LEASE_RETRIES = 3
MAX_LEASE_WAIT = 30.0  # seconds; a lease longer than this is the caller's to wait out
DEFAULT_MASTER = "127.0.0.1:50051"
DUMMY_LOOKUP_TIMEOUT = 5.0  # seconds for the real client (or master) to name its master
INIT_ALL_HOSTNAME, INIT_ALL_BUFFER = "localhost:12345", 2**30  # the original's init_all fixes these


class NotSetUp(SetupError):
    """A call before ``setup`` or after ``close``."""


class StoreLifecycle:
    def __init__(self) -> None:
        self._client: StoreClient | None = None
        self._hostname = ""
        self._port_holder: socket.socket | None = None
        self._finalizer: weakref.finalize | None = None
        self._client_id = ""
        self._local_buffer_size = DEFAULT_SIZE
        self._registered: dict[int, Any] = {}  # address -> the array registered over it
        # A dummy client's pool outlives close(): callers may still hold its addresses.
        self._mem_pool: MemoryPool | None = None

    # -- setup ----------------------------------------------------------------------------------
    def setup(self, local_hostname: str | dict, metadata_server: str = P2P,
              global_segment_size: int | str = DEFAULT_SIZE, local_buffer_size: int | str = DEFAULT_SIZE,
              protocol: str = "tcp", rdma_devices: str = "", master_server_addr: str = DEFAULT_MASTER,
              engine: Any = None, enable_ssd_offload: bool = False, ssd_offload_path: str = "",
              tenant_id: str = "default", enable_client_http_server: bool = False,
              client_http_port: int = 9300) -> int:
        """0 once connected (and the segment mounted); a negative code otherwise. Also takes
        one dict with the same keys (``master_server_address`` and ``device_name`` accepted)."""
        if isinstance(local_hostname, dict):
            return self._setup_from(local_hostname)
        try:
            check_metadata_server(metadata_server)
            buffer_size = parse_size(local_buffer_size, "local_buffer_size")
            code = self._start(local_hostname, parse_size(global_segment_size, "global_segment_size"),
                               engine_protocol(protocol), master_address(master_server_addr),
                               tenant_id or "default")  # empty: the default tenant, as in the original
            self._local_buffer_size = buffer_size
            return code
        except Exception as exc:
            return logged("setup", exc)

    def _setup_from(self, config: dict) -> int:
        known = {"local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
                 "protocol", "rdma_devices", "device_name", "master_server_address", "master_server_addr",
                 "tenant_id"}
        unknown = set(config) - known
        if unknown or "local_hostname" not in config:
            return logged("setup", SetupError(f"setup(dict): unknown keys {sorted(unknown)} or no local_hostname"))
        return self.setup(
            config["local_hostname"], config.get("metadata_server", P2P),
            config.get("global_segment_size", DEFAULT_SIZE), config.get("local_buffer_size", DEFAULT_SIZE),
            config.get("protocol", "tcp"), config.get("rdma_devices", config.get("device_name", "")),
            config.get("master_server_address", config.get("master_server_addr", DEFAULT_MASTER)),
            tenant_id=config.get("tenant_id", "default"))

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        try:
            pool_size = parse_size(mem_pool_size, "mem_pool_size")
            buffer_size = parse_size(local_buffer_size, "local_buffer_size")
            code = self._start("127.0.0.1", 0, "auto", _master_behind(master_address(server_address)))
            self._local_buffer_size = buffer_size
            if self._mem_pool is None:
                self._mem_pool = MemoryPool(pool_size)
            return code
        except Exception as exc:
            return logged("setup_dummy", exc)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = DEFAULT_SIZE) -> int:
        """The original's shortcut: setup as "localhost:12345" with a ``mount_segment_size``
        segment and a 1 GiB local buffer, against the default master (127.0.0.1:50051);
        INVALID_PARAMS when already set up. Its etcd metadata server is not asked for: our
        segments resolve through the master."""
        if self._client is not None:
            return logged("init_all", SetupError("the store is already set up"))
        return self.setup(INIT_ALL_HOSTNAME, P2P, mount_segment_size, INIT_ALL_BUFFER, protocol, device_name)

    def alloc_from_mem_pool(self, size: int) -> int:
        """The address of ``size`` bytes of the dummy client's pool, for register_buffer and the
        zero-copy calls; 0 when the pool is short, or for a store set up with ``setup`` (the
        original's real client has no pool either)."""
        address = self._mem_pool.allocate(size) if self._mem_pool is not None else 0
        if not address:
            log.error("alloc_from_mem_pool(%d): %s", size,
                      "the pool is exhausted" if self._mem_pool is not None else "not a dummy client")
        return address

    def _start(self, local_hostname: str, segment_size: int, protocol: str, master: str,
               tenant: str = "default") -> int:
        if self._client is not None:
            raise SetupError("the store is already set up; close it first")
        host, port = split_hostname(local_hostname)
        ip = bind_address(host)
        holder = None
        if port is None:
            holder = reserve_port(ip)
            port = holder.getsockname()[1]
        name = f"{host}:{port}"
        client_id = _NAMES.acquire(name)
        try:
            config = resolve({"bind_host": ip, "transfer_protocol": protocol, "tenant": tenant})
            if config.sources["segment_prefault"] == "default":
                # The original leaves an embedded store's segment untouched until objects land in
                # it, and engines make one per rank (4 GB by default; SGLang's own test makes five
                # in one process): committing each at mount, as our store-client daemons do, would
                # take all that RAM at once. MOONCAKE_SEGMENT_PREFAULT still decides when set.
                config = config.replace(segment_prefault=False)
            self._client = StoreClient(master, config, segment_size=segment_size, client_id=client_id)
        except BaseException:
            _NAMES.release(client_id)
            if holder is not None:
                holder.close()
            raise
        self._hostname, self._port_holder, self._client_id = name, holder, client_id
        # A store dropped without close() (SGLang does) must not leave its client running once
        # its port, and so its name, is free for the next store: the finalizer closes both, the
        # client first. It holds them itself, never the store, so it runs when the store goes.
        self._finalizer = weakref.finalize(self, _release, self._client, holder, client_id)
        return 0

    # -- teardown and identity ------------------------------------------------------------------
    def close(self) -> int:
        client, self._client = self._client, None
        if client is None:
            return 0
        self._registered.clear()
        holder, self._port_holder = self._port_holder, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        try:
            client.close()
        except MooncakeError as exc:
            return logged("close", exc)
        finally:
            _NAMES.release(self._client_id)
            if holder is not None:
                holder.close()  # only now may another store take this name
        return 0

    def get_hostname(self) -> str:
        """"host:port", the name other clients use for this one's segment."""
        return self._hostname

    def health_check(self) -> int:
        """0 when the master answers; a negative code otherwise."""
        return self._int("health_check", _master_health)

    # -- helpers --------------------------------------------------------------------------------
    def _require(self) -> StoreClient:
        if self._client is None:
            raise NotSetUp("the store is not set up (or was closed)")
        return self._client

    def _int(self, operation: str, call: Callable[[StoreClient], int]) -> int:
        try:
            return call(self._require())
        except Exception as exc:
            return logged(operation, exc)

    def _ints(self, operation: str, count: int, call: Callable[[StoreClient], list]) -> list[int]:
        """Per item the value or the code of its error; every item the code if the call failed."""
        try:
            return [code_of(r) if isinstance(r, BaseException) else r for r in call(self._require())]
        except Exception as exc:
            return [logged(operation, exc)] * count

    def _upserted(self, client: StoreClient, keys: list[str], upsert: bool,
                  put: Callable[[list[int]], list[int]]) -> list[int]:
        """``put(indices)`` -> codes, for all keys; for an upsert, the keys refused because a read
        lease still runs (OBJECT_HAS_LEASE) are put again once it has run out. The original
        overwrites in place under a lease; our master refuses, so that no reader ever copies
        half-old, half-new bytes, and waiting out the lease (the master's TTL, 10 s by default)
        gives the original's result with that guarantee kept."""
        codes = put(list(range(len(keys))))
        for _ in range(UPSERT_LEASE_RETRIES if upsert else 0):
            leased = [i for i, code in enumerate(codes) if code == HAS_LEASE]
            if not leased:
                break
            wait_out_leases(client, [keys[i] for i in leased])
            for i, code in zip(leased, put(leased)):
                codes[i] = code
        return codes

    def _check_local_buffer(self, sizes: list[int]) -> None:
        """The original copies put values through its local buffer of ``local_buffer_size``
        bytes and refuses (INVALID_PARAMS) a value that does not fit; so does this store."""
        for size in sizes:
            if size > self._local_buffer_size:
                raise SetupError(f"a {size}-byte value does not fit the {self._local_buffer_size}-byte "
                                 "local buffer (local_buffer_size)")

    def _replication(self, config: Any) -> dict[str, Any]:
        if config is None:
            return {}
        replication = config.replication()
        wanted = config.preferred()
        if wanted:
            replication["preferred_segments"] = tuple(self._segment_ids(wanted))
        return replication

    def _segment_ids(self, names: list[str]) -> list[str]:
        """Our segment ids for the original's segment names ("host:port"); ids pass through.
        Unknown names are dropped: a preference, not a requirement."""
        client = self._require()
        # LMCache prefers its own segment on every put: skip the lookup. Not when another live
        # store of this process took the same "host:port" (the original's tests do): the
        # original knows both segments by that one name, and so does the lookup below.
        if client.owner is not None and names == [self._hostname] and not _NAMES.is_shared(self._hostname):
            return [client.owner.segment.segment_id]
        rows = client.master.inspect("segments")
        return [row["segment_id"] for name in names for row in rows
                if name in (row["name"], row["segment_id"], hostname_of(row["client_id"]))]


def _lease_left(client: StoreClient, key: str) -> float:
    try:
        return float(client.master.inspect("key", key)["lease_left"])
    except Exception:
        return 0.0


def wait_out_leases(client: StoreClient, keys: list[str]) -> None:
    """Sleep until the longest read lease on ``keys`` has run out (at most MAX_LEASE_WAIT)."""
    time.sleep(min(MAX_LEASE_WAIT, max(_lease_left(client, key) for key in keys)) + 0.01)


class _LiveNames:
    """The client ids of this process's live stores. A store set up with an explicit
    "host:port" another live store already uses (the original's tests do, with a store they
    never close) gets a distinct id, so two clients never share one segment name; its
    ``get_hostname`` is still the name it was given."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def acquire(self, name: str) -> str:
        with self._lock:
            client_id, n = name, 1
            while client_id in self._ids:
                n += 1
                client_id = f"{name}{CLIENT_ID_SEPARATOR}{n}"
            self._ids.add(client_id)
            return client_id

    def is_shared(self, name: str) -> bool:
        """Whether more than one live store goes by ``name``."""
        with self._lock:
            return sum(1 for i in self._ids if hostname_of(i) == name) > 1

    def release(self, client_id: str) -> None:
        with self._lock:
            self._ids.discard(client_id)


_NAMES = _LiveNames()


def _release(client: StoreClient, holder: socket.socket | None, client_id: str) -> None:
    """Close a dropped store's client, then free its name and port."""
    try:
        client.close()
    except Exception:  # a finalizer has no caller to tell; the master's TTL drops the client
        pass
    finally:
        _NAMES.release(client_id)
        if holder is not None:
            holder.close()


def _master_behind(address: str) -> str:
    """The master a dummy client joins: the one a store-client daemon at ``address`` serves, or
    ``address`` itself when a master answers there."""
    with RpcClient(address, timeout=DUMMY_LOOKUP_TIMEOUT, secret=cluster_secret(resolve())) as daemon:
        status = daemon.call("status")
    if status.get("role") == "store-client":
        return status["master"]
    if status.get("role") == "master":
        return address
    raise SetupError(f"{address} is a {status.get('role')!r} daemon, neither a store client nor a master")


def _master_health(client: StoreClient) -> int:
    client.master.rpc.call("health")  # raises the RPC error when the master does not answer
    return 0


def put_code(result: Any) -> int:
    """The original reports a put of a key that already exists as success (it is immutable:
    the bytes there are the ones asked for), so ObjectAlreadyExists is 0 here too."""
    if result is None or isinstance(result, ObjectAlreadyExists):
        return 0
    return code_of(result) if isinstance(result, BaseException) else INVALID_PARAMS
