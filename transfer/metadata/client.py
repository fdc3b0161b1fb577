"""Where an engine publishes its descriptor and finds its peers': three interchangeable backends.

- :class:`LocalMetadata` wraps a :class:`MetadataTable` in this process (tests, single process).
- :class:`MasterMetadata` talks to the te.meta.* ops a master serves (``serve_metadata``).
- :class:`P2PMetadata` needs no master: a segment is named ``host:port`` of its engine's RPC
  server, and fetching it is one ``te.exchange`` call that sends our descriptor and returns the
  peer's (Mooncake's P2PHANDSHAKE).
"""

from __future__ import annotations

import threading
from typing import Protocol
from collections.abc import Callable

from transfer.auth import ClusterSecret
from transfer.descriptor import SegmentDescriptor
from transfer.errors import RpcError, SegmentNotFound
from transfer.etcd.leader import master_rpc
from transfer.metadata.table import MetadataTable
from transfer.rpc.client_server import FAREWELL_TIMEOUT_S, RpcClient

P2P = "P2PHANDSHAKE"
EXCHANGE_OP = "te.exchange"


class MetadataBackend(Protocol):
    def publish(self, descriptor: SegmentDescriptor) -> int: ...
    def fetch(self, name: str) -> SegmentDescriptor: ...
    def withdraw(self, descriptor: SegmentDescriptor) -> None: ...
    def close(self) -> None: ...


class LocalMetadata:
    def __init__(self, table: MetadataTable) -> None:
        self.table = table

    def publish(self, descriptor: SegmentDescriptor) -> int:
        return self.table.put(descriptor)

    def fetch(self, name: str) -> SegmentDescriptor:
        return self.table.get(name)

    def withdraw(self, descriptor: SegmentDescriptor) -> None:
        self.table.remove(descriptor.name, descriptor.incarnation)

    def close(self) -> None:
        pass


class MasterMetadata:
    def __init__(self, address: str, timeout: float = 5.0, secret: ClusterSecret | None = None) -> None:
        self._client = master_rpc(address, timeout=timeout, secret=secret)  # etcd://... follows the elected master

    def publish(self, descriptor: SegmentDescriptor) -> int:
        return int(self._client.call("te.meta.put", {"descriptor": descriptor.to_wire()})["version"])

    def fetch(self, name: str) -> SegmentDescriptor:
        return SegmentDescriptor.from_wire(self._client.call("te.meta.get", {"name": name}))

    def withdraw(self, descriptor: SegmentDescriptor) -> None:
        # Called by a closing engine: a master that is gone must not hold up the exit.
        self._client.call("te.meta.remove", {"name": descriptor.name, "incarnation": descriptor.incarnation},
                          timeout=FAREWELL_TIMEOUT_S)

    def close(self) -> None:
        self._client.close()


class P2PMetadata:
    def __init__(self, local: Callable[[], SegmentDescriptor], timeout: float = 5.0,
                 secret: ClusterSecret | None = None) -> None:
        self._local = local
        self._timeout = timeout
        self._secret = secret
        self._version = 0
        self._lock = threading.Lock()

    def publish(self, descriptor: SegmentDescriptor) -> int:
        # Nothing central to update: peers get the newest descriptor on their next exchange.
        with self._lock:
            self._version += 1
            return self._version

    def fetch(self, name: str) -> SegmentDescriptor:
        host, sep, port = name.rpartition(":")
        if not sep or not port.isdigit():
            raise SegmentNotFound(f"P2P segment names are host:port, not {name!r}")
        try:
            with RpcClient(f"tcp://{host}:{port}", timeout=self._timeout, secret=self._secret) as client:
                wire = client.call(EXCHANGE_OP, {"descriptor": self._local().to_wire()})
        except RpcError as exc:
            raise SegmentNotFound(f"no engine answered at {name}: {exc.message}") from None
        return SegmentDescriptor.from_wire(wire)

    def withdraw(self, descriptor: SegmentDescriptor) -> None:
        pass

    def close(self) -> None:
        pass
