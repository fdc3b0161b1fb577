"""The original's ``TransferEngine`` Python class over our :class:`transfer.engine.TransferEngine`.

``initialize(local_hostname, metadata_server, protocol, device_name)`` picks where segment
descriptors live:

- "P2PHANDSHAKE": nowhere central; this engine's segment is named "ip:rpc_port" (what
  ``get_rpc_port`` returns), and a peer's descriptor is fetched from the peer itself.
- "http://host:port/metadata": Mooncake's HTTP metadata protocol (``mooncake start master
  --enable_http_metadata_server`` serves it); the segment is named ``local_hostname``.
- "tcp://host:port": our master's metadata service; the segment is named ``local_hostname``.
- "etcd://host:port[,host:port]" (or a bare "host:port", which the original reads as etcd):
  descriptors in etcd under the default cluster id; the segment is named ``local_hostname``.

redis is not supported by the engine (initialize returns -1 saying so). A port in
``local_hostname`` is not used as the RPC port under P2PHANDSHAKE: the engine binds a free one.
``device_name`` is the original's NIC filter; our engine probes its RDMA devices itself.

Every call returns 0 (or a batch id, or an address) on success and a negative code on failure,
as the original: -1 invalid argument, -3 address not registered, -7 overlapping registration,
-210 unknown segment, -800 transfer failed, -801 timed out; the calls that return a batch id
(``transfer_submit_write``, ``batch_transfer_async_*``) return 0 instead, as the original does.
Addresses are host memory: a GPU pointer is refused with -1 (see ``mooncake._raw_memory``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from mooncake._codes import logged
from mooncake._raw_memory import array_at, check_host
from mooncake._setup_args import P2P, bind_address, check_metadata_server, engine_protocol, split_hostname
from transfer.batch import OpCode, Status, TransferRequest
from transfer.engine import TransferEngine as OurEngine
from transfer.engine_options import EngineOptions
from transfer.errors import InvalidArgument
from transfer.etcd.leader import ETCD_SCHEME
from transfer.memory import address_of
from transfer.metadata.etcd_backend import EtcdMetadata
from transfer.metadata.http_backend import HttpMetadata
from transfer.settings import setting

log = logging.getLogger("mooncake")
FAILED = -1


class TransferEngine:
    def __init__(self) -> None:
        self._engine: OurEngine | None = None
        self._registered: dict[int, Any] = {}  # address -> the array registered over it
        self._managed: dict[int, Any] = {}  # address -> the shared buffer allocate_managed_buffer made

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        try:
            if self._engine is not None:
                raise InvalidArgument("the engine is already initialized")
            host, _ = split_hostname(local_hostname)
            # Resolved from the environment: MOONCAKE_CLUSTER_SECRET and the rest reach the drop-in.
            options = EngineOptions.from_config(protocol=engine_protocol(protocol))
            metadata, name = self._metadata(metadata_server, local_hostname, options)
            self._engine = OurEngine(name, metadata=metadata, host=bind_address(host), options=options)
        except Exception as exc:
            return logged("initialize", exc)
        return 0

    def _metadata(self, metadata_server: str, local_hostname: str,
                  options: EngineOptions) -> tuple[Any, str | None]:
        metadata_server = check_metadata_server(metadata_server)
        if metadata_server == P2P:
            return P2P, None
        if metadata_server.startswith(ETCD_SCHEME):
            endpoints = metadata_server[len(ETCD_SCHEME):].partition("/")[0]
            return EtcdMetadata(endpoints, setting("cluster_id").default), local_hostname
        if metadata_server.startswith(("http://", "https://")):
            token = options.secret.http_token if options.secret else None
            return HttpMetadata(metadata_server, token=token), local_hostname
        if metadata_server.startswith("tcp://"):
            return metadata_server, local_hostname
        raise InvalidArgument(f"metadata server {metadata_server!r}: this engine takes P2PHANDSHAKE, "
                              "an http:// or etcd:// metadata server or our master's tcp:// address")

    def get_rpc_port(self) -> int:
        return self._int("get_rpc_port", lambda engine: int(engine.rpc_address.rsplit(":", 1)[1]))

    def get_local_topology(self, device_name: str = "") -> str:
        """The topology matrix paths are chosen from, as JSON ({location: [[preferred], [others]]})."""
        return json.dumps(self._engine.topology) if self._engine is not None else ""

    def close(self) -> int:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        self._registered.clear()
        self._managed.clear()
        return 0

    # -- memory ---------------------------------------------------------------------------------
    def register_memory(self, buffer_addr: int, capacity: int) -> int:
        def call(engine: OurEngine) -> int:
            check_host(buffer_addr, capacity, "register_memory", FAILED)
            array = array_at(buffer_addr, capacity)
            engine.register_local_memory(array)
            self._registered[buffer_addr] = array
            return 0
        return self._int("register_memory", call)

    def unregister_memory(self, buffer_addr: int) -> int:
        def call(engine: OurEngine) -> int:
            engine.unregister_local_memory(buffer_addr)
            self._registered.pop(buffer_addr, None)
            return 0
        return self._int("unregister_memory", call)

    def batch_register_memory(self, buffer_addresses: list[int], capacities: list[int]) -> int:
        """0 when every range was registered; else the first failure's code (the ranges before
        it stay registered, as with the original)."""
        if len(buffer_addresses) != len(capacities):
            return FAILED
        for address, capacity in zip(buffer_addresses, capacities):
            code = self.register_memory(address, capacity)
            if code != 0:
                return code
        return 0

    def allocate_managed_buffer(self, length: int) -> int:
        """The address of ``length`` registered bytes in shared memory (so same-host peers copy
        into it directly), or 0 on failure."""
        def call(engine: OurEngine) -> int:
            buffer = engine.allocate_shared_buffer(length)
            address = address_of(buffer)
            self._managed[address] = buffer
            return address
        address = self._int("allocate_managed_buffer", call)
        return max(address, 0)

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        if buffer_addr not in self._managed:
            return FAILED
        code = self._int("free_managed_buffer", lambda engine: engine.unregister_local_memory(buffer_addr) or 0)
        if code == 0:
            del self._managed[buffer_addr]
        return code

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The lowest address of a segment's registered memory (its first buffer); 0 when it
        has none yet, or cannot be reached (the original's "no buffer" answer)."""
        return max(self._int("get_first_buffer_address", lambda engine: _first_buffer(engine, segment_name)), 0)

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copy ``length`` bytes of ``src_ptr`` (bytes-like) to host memory at ``dest_address``."""
        def call(engine: OurEngine) -> int:
            source = memoryview(src_ptr).cast("B")
            if not 0 <= length <= source.nbytes:
                raise InvalidArgument(f"length {length} is outside the {source.nbytes} bytes given")
            if length:
                check_host(dest_address, length, "write_bytes_to_buffer", FAILED)
                array_at(dest_address, length)[:] = np.frombuffer(source[:length], dtype=np.uint8)
            return 0
        return self._int("write_bytes_to_buffer", call)

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """``length`` bytes of host memory at ``source_address`` (b"" when refused)."""
        try:
            check_host(source_address, length, "read_bytes_from_buffer", FAILED)
            return array_at(source_address, length).tobytes() if length > 0 else b""
        except Exception as exc:
            logged("read_bytes_from_buffer", exc)
            return b""

    def send_probe(self, target_hostname: str) -> int:
        """0 when the peer's segment is known and its engine answers; a negative code otherwise."""
        def call(engine: OurEngine) -> int:
            engine.open_segment(target_hostname)
            engine.sync_segment_cache(target_hostname)  # asks the metadata service again
            return 0
        return self._int("send_probe", call)

    # -- transfers ------------------------------------------------------------------------------
    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        return self.batch_transfer_sync_write(target_hostname, [buffer], [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        return self.batch_transfer_sync_read(target_hostname, [buffer], [peer_buffer_address], [length])

    def batch_transfer_sync_write(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int],
                                  lengths: list[int]) -> int:
        return self._sync(OpCode.WRITE, target_hostname, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int],
                                 lengths: list[int]) -> int:
        return self._sync(OpCode.READ, target_hostname, buffers, peer_buffer_addresses, lengths)

    def _sync(self, opcode: OpCode, target: str, buffers: list[int], peers: list[int], lengths: list[int]) -> int:
        def call(engine: OurEngine) -> int:
            engine.transfer_sync(_requests(engine, opcode, target, buffers, peers, lengths))
            return 0
        return self._int("transfer_sync", call)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        """A batch id to poll with ``transfer_check_status``, or 0 when nothing was submitted
        (an unknown peer, an unregistered buffer): the original's failure sentinel."""
        return max(self._submit(OpCode.WRITE, target_hostname, [buffer], [peer_buffer_address], [length]), 0)

    def batch_transfer_async_write(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int],
                                   lengths: list[int]) -> int:
        return max(self._submit(OpCode.WRITE, target_hostname, buffers, peer_buffer_addresses, lengths), 0)

    def batch_transfer_async_read(self, target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int],
                                  lengths: list[int]) -> int:
        """A batch id for ``get_batch_transfer_status``, or 0 when nothing was submitted."""
        return max(self._submit(OpCode.READ, target_hostname, buffers, peer_buffer_addresses, lengths), 0)

    def _submit(self, opcode: OpCode, target: str, buffers: list[int], peers: list[int], lengths: list[int]) -> int:
        def call(engine: OurEngine) -> int:
            requests = _requests(engine, opcode, target, buffers, peers, lengths)
            batch_id = engine.allocate_batch_id(len(requests))
            try:
                engine.submit_transfer(batch_id, requests)
            except BaseException:
                engine.free_batch_id(batch_id)  # nothing of it was queued
                raise
            return batch_id
        return self._int("transfer_submit", call)

    def transfer_check_status(self, batch_id: int) -> int:
        """1 completed, 0 still running, -1 failed, -2 timed out; a finished batch is freed."""
        def call(engine: OurEngine) -> int:
            status = engine.get_batch_transfer_status(batch_id).status
            if status == Status.PENDING:
                return 0
            engine.free_batch_id(batch_id)
            return {Status.COMPLETED: 1, Status.TIMEOUT: -2}.get(status, FAILED)
        return self._int("transfer_check_status", call)

    def get_batch_transfer_status(self, batch_ids: list[int]) -> int:
        """Wait for every batch (each request has a deadline); 0 when all completed, -1 when any
        failed or timed out. The batches are freed."""
        def call(engine: OurEngine) -> int:
            outcome = 0
            for batch_id in batch_ids:
                if engine.wait_batch(batch_id).status != Status.COMPLETED:
                    outcome = FAILED
                engine.free_batch_id(batch_id)
            return outcome
        return self._int("get_batch_transfer_status", call)

    # -- helpers --------------------------------------------------------------------------------
    def _int(self, operation: str, call: Callable[[OurEngine], int]) -> int:
        try:
            if self._engine is None:
                raise InvalidArgument("the engine is not initialized")
            return call(self._engine)
        except Exception as exc:
            return logged(operation, exc)


def _requests(engine: OurEngine, opcode: OpCode, target: str, buffers: list[int], peers: list[int],
              lengths: list[int]) -> list[TransferRequest]:
    if not len(buffers) == len(peers) == len(lengths) or not buffers:
        raise InvalidArgument("buffers, peer addresses and lengths must be non-empty and of one length")
    handle = engine.open_segment(target)
    descriptor = engine.segment_descriptor(handle)
    if not all(_inside(descriptor, peer, length) for peer, length in zip(peers, lengths)):
        # The peer may have registered memory since we cached its descriptor (vLLM registers
        # the KV caches after the handshake starts): fetch it again before refusing.
        engine.sync_segment_cache(target)
    return [TransferRequest(opcode, buffer, handle, peer, length)
            for buffer, peer, length in zip(buffers, peers, lengths)]


def _first_buffer(engine: OurEngine, segment_name: str) -> int:
    engine.open_segment(segment_name)
    engine.sync_segment_cache(segment_name)  # its buffers now, not when we first met it
    buffers = engine.segment_descriptor(segment_name).buffers
    if not buffers:
        raise InvalidArgument(f"segment {segment_name!r} has no registered memory")
    return buffers[0].address


def _inside(descriptor: Any, address: int, length: int) -> bool:
    return any(b.address <= address and address + length <= b.end for b in descriptor.buffers)
