"""Finding the master: a fixed address, or the leader that etcd names.

A master spec is ``tcp://host:port``, ``host:port``, or ``etcd://host:port[,host:port][/cluster]``.
With etcd, the leader's address is the value of ``mooncake-store/<cluster>/master_view`` (the
key the masters' election holds with a lease, as Mooncake's C++ master does).

:func:`master_rpc` returns the RPC client for a spec. For an etcd spec it is a
:class:`LeaderClient`: a call that times out or is answered NOT_LEADER makes it read the view
again, and if another master leads now, it moves there and retries once. Anything else (the
view still names the silent master, because its lease has not lapsed yet) raises to the caller,
whose own retry (the next ping, the next put) then finds the new leader.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from collections.abc import Sequence

from transfer.auth import ClusterSecret
from transfer.errors import NotLeader, RpcTimeout
from transfer.etcd.kv import EtcdKV, EtcdUnavailable
from transfer.rpc.client_server import Reply, RpcClient

ETCD_SCHEME = "etcd://"
DEFAULT_CLUSTER = "mooncake"


def master_view_key(cluster_id: str) -> str:
    return f"mooncake-store/{cluster_id}/master_view"


def tcp_address(address: str) -> str:
    return address if "://" in address else f"tcp://{address}"


def etcd_spec(endpoints: str, cluster_id: str) -> str:
    return f"{ETCD_SCHEME}{endpoints}/{cluster_id}"


class MasterView:
    """The etcd view of one cluster's leader."""

    def __init__(self, spec: str, timeout: float = 2.0) -> None:
        endpoints, _, cluster = spec[len(ETCD_SCHEME):].partition("/")
        self.cluster_id = cluster or DEFAULT_CLUSTER
        self.key = master_view_key(self.cluster_id)
        self.kv = EtcdKV(endpoints, timeout)
        self.latest: str | None = None  # the leader last read from etcd

    def leader(self) -> str | None:
        try:
            address = self.kv.get(self.key)
        except EtcdUnavailable:
            return None
        if address is not None:
            self.latest = address
        return address

    def wait_leader(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (address := self.leader()) is None:
            if time.monotonic() >= deadline:
                raise NotLeader(f"no master leads cluster {self.cluster_id!r} (etcd key {self.key})")
            time.sleep(0.1)
        return address


_VIEWS: dict[str, MasterView] = {}
_VIEWS_LOCK = threading.Lock()


def view_of(spec: str, timeout: float) -> MasterView:
    """One view per spec in a process, so that when one client (the store client's pings) finds
    a new leader, the others (its engine's metadata client) move at once instead of each first
    waiting out a timeout on the dead master."""
    with _VIEWS_LOCK:
        if spec not in _VIEWS:
            _VIEWS[spec] = MasterView(spec, timeout)
        return _VIEWS[spec]


class LeaderClient:
    """An :class:`RpcClient` that follows the elected master (same call interface)."""

    def __init__(self, spec: str, timeout: float = 5.0, busy_poll: float = 0.0,
                 secret: ClusterSecret | None = None) -> None:
        self.view = view_of(spec, timeout=min(timeout, 2.0))
        self.timeout, self.busy_poll, self.secret = timeout, busy_poll, secret
        self._lock = threading.Lock()
        self.address = self.view.wait_leader(timeout)
        self._rpc = RpcClient(self.address, timeout=timeout, busy_poll=busy_poll, secret=secret)
        self.num_follows = 0
        # Clients we moved away from stay open until close(): other threads may still be
        # waiting on them, and closing a socket under a waiter is not a clean error.
        self._retired: list[RpcClient] = []

    def call(self, op: str, args: dict | None = None, frames: Sequence[Any] = (),
             timeout: float | None = None) -> Any:
        return self.call_frames(op, args, frames, timeout).result

    def call_frames(self, op: str, args: dict | None = None, frames: Sequence[Any] = (),
                    timeout: float | None = None) -> Reply:
        rpc = self._rpc
        if self.view.latest not in (None, self.address):
            self._follow(rpc, self.view.latest)
            rpc = self._rpc
        try:
            return rpc.call_frames(op, args, frames, timeout)
        except (NotLeader, RpcTimeout):
            if not self._follow(rpc):
                raise
        return self._rpc.call_frames(op, args, frames, timeout)

    def _follow(self, failed: RpcClient, address: str | None = None) -> bool:
        """Move to ``address`` or else the leader etcd names now; False when that is still the
        one that failed."""
        address = address or self.view.leader()
        with self._lock:
            if self._rpc is not failed:
                return True  # another thread already moved
            if address is None or address == failed.address:
                return False
            self._rpc = RpcClient(address, timeout=self.timeout, busy_poll=self.busy_poll, secret=self.secret)
            self.address = address
            self._retired.append(failed)
            self.num_follows += 1
        return True

    def close(self) -> None:
        for rpc in (*self._retired, self._rpc):
            rpc.close()

    def __enter__(self) -> LeaderClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def master_rpc(spec: str, timeout: float = 5.0, busy_poll: float = 0.0,
               secret: ClusterSecret | None = None) -> RpcClient | LeaderClient:
    if spec.startswith(ETCD_SCHEME):
        return LeaderClient(spec, timeout, busy_poll, secret)
    return RpcClient(tcp_address(spec), timeout=timeout, busy_poll=busy_poll, secret=secret)
