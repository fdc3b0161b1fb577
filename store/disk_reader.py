"""Reads of disk replicas: asked of the segment owner that holds the file, over its RPC server.

The bytes come back as one bulk frame and are copied straight into the reader's registered
memory; the caller verifies them against the master's checksum like any other replica. One RPC
client per owner, kept for the next read.
"""

from __future__ import annotations

import threading

from store.errors import InvalidParams, MooncakeError
from store.objects import ReplicaDescriptor
from transfer.engine import TransferEngine
from transfer.rpc.client_server import RpcClient


class DiskReader:
    def __init__(self, engine: TransferEngine, timeout: float) -> None:
        self.engine, self.timeout = engine, timeout
        self._clients: dict[str, RpcClient] = {}
        self._lock = threading.Lock()

    def read(self, key: str, replica: ReplicaDescriptor, address: int) -> MooncakeError | None:
        """Fill [address, +replica.size) with the file's bytes; the error instead of raising."""
        try:
            reply = self._client(replica.endpoint).call_frames("store.disk_read", {"key": key})
            data = memoryview(reply.frames[0]) if reply.frames else memoryview(b"")
            if data.nbytes != replica.size:
                return InvalidParams(f"{key!r}: the disk replica has {data.nbytes} bytes, not {replica.size}")
            self.engine.buffer_at(address, replica.size)[:] = data
            self.engine.copy_to_device(address, replica.size)  # GPU memory: the view is its mirror
            return None
        except MooncakeError as exc:
            return exc

    def _client(self, endpoint: str) -> RpcClient:
        if not endpoint:
            raise InvalidParams("the disk replica's owner serves no SSD tier")
        with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                client = self._clients[endpoint] = RpcClient(endpoint, timeout=self.timeout,
                                                                     secret=self.engine.options.secret)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
