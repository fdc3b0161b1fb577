"""Setting the store up and tearing it down, and the helpers every call goes through.

``setup`` builds one of our :class:`store.client.StoreClient` s: it connects to our master at
``master_server_addr`` and, when ``global_segment_size`` > 0, contributes a segment of that
size (Mooncake's "embedded" mode). ``setup_dummy`` builds one with no segment, using the pool
that store-client daemons contribute (Mooncake's standalone mode, where a separate real client
owns the pool; here ``server_address`` is our master's address, which knows that pool).

``metadata_server`` is checked but, whatever it names, segment descriptors go through the
master: every store client of the cluster, daemons included, publishes there, so that is the
one place all of them find each other. ``local_buffer_size`` is checked and otherwise unused:
our client stages plain-bytes puts in a per-thread buffer it sizes itself. ``engine`` (a
TransferEngine to share) is accepted for the signature; our client keeps its own. So are
SGLang's keywords (SSD offload, tenant, client HTTP server), which the original added later:
SGLang passes them when setup takes them, and our SSD tier is a master setting.
"""

from __future__ import annotations

import socket
from typing import Any
from collections.abc import Callable

from mooncake._codes import INVALID_PARAMS, code_of, logged
from mooncake._setup_args import (P2P, SetupError, bind_address, check_metadata_server, engine_protocol,
                                  master_address, parse_size, reserve_port, split_hostname)
from store.client import StoreClient
from store.errors import ObjectAlreadyExists
from transfer.errors import MooncakeError
from transfer.settings import resolve

DEFAULT_SIZE = 16 * 2**20
DEFAULT_MASTER = "127.0.0.1:50051"


class NotSetUp(SetupError):
    """A call before ``setup`` or after ``close``."""


class StoreLifecycle:
    def __init__(self) -> None:
        self._client: StoreClient | None = None
        self._hostname = ""
        self._port_holder: socket.socket | None = None
        self._registered: dict[int, Any] = {}  # address -> the array registered over it

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
            parse_size(local_buffer_size, "local_buffer_size")
            return self._start(local_hostname, parse_size(global_segment_size, "global_segment_size"),
                               engine_protocol(protocol), master_address(master_server_addr))
        except Exception as exc:
            return logged("setup", exc)

    def _setup_from(self, config: dict) -> int:
        known = {"local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
                 "protocol", "rdma_devices", "device_name", "master_server_address", "master_server_addr"}
        unknown = set(config) - known
        if unknown or "local_hostname" not in config:
            return logged("setup", SetupError(f"setup(dict): unknown keys {sorted(unknown)} or no local_hostname"))
        return self.setup(
            config["local_hostname"], config.get("metadata_server", P2P),
            config.get("global_segment_size", DEFAULT_SIZE), config.get("local_buffer_size", DEFAULT_SIZE),
            config.get("protocol", "tcp"), config.get("rdma_devices", config.get("device_name", "")),
            config.get("master_server_address", config.get("master_server_addr", DEFAULT_MASTER)))

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        try:
            parse_size(mem_pool_size, "mem_pool_size")
            parse_size(local_buffer_size, "local_buffer_size")
            return self._start("127.0.0.1", 0, "auto", master_address(server_address))
        except Exception as exc:
            return logged("setup_dummy", exc)

    def _start(self, local_hostname: str, segment_size: int, protocol: str, master: str) -> int:
        if self._client is not None:
            raise SetupError("the store is already set up; close it first")
        host, port = split_hostname(local_hostname)
        ip = bind_address(host)
        holder = None
        if port is None:
            holder = reserve_port(ip)
            port = holder.getsockname()[1]
        name = f"{host}:{port}"
        try:
            config = resolve({"bind_host": ip, "transfer_protocol": protocol})
            self._client = StoreClient(master, config, segment_size=segment_size, client_id=name)
        except BaseException:
            if holder is not None:
                holder.close()
            raise
        self._hostname, self._port_holder = name, holder
        return 0

    # -- teardown and identity ------------------------------------------------------------------
    def close(self) -> int:
        client, self._client = self._client, None
        if client is None:
            return 0
        self._registered.clear()
        if self._port_holder is not None:
            self._port_holder.close()
            self._port_holder = None
        try:
            client.close()
        except MooncakeError as exc:
            return logged("close", exc)
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
        if client.owner is not None and names == [self._hostname]:
            return [client.owner.segment.segment_id]  # LMCache prefers its own, on every put
        rows = client.master.inspect("segments")
        return [row["segment_id"] for name in names for row in rows
                if name in (row["name"], row["segment_id"])]


def _master_health(client: StoreClient) -> int:
    client.master.rpc.call("health")  # raises the RPC error when the master does not answer
    return 0


def put_code(result: Any) -> int:
    """The original reports a put of a key that already exists as success (it is immutable:
    the bytes there are the ones asked for), so ObjectAlreadyExists is 0 here too."""
    if result is None or isinstance(result, ObjectAlreadyExists):
        return 0
    return code_of(result) if isinstance(result, BaseException) else INVALID_PARAMS
