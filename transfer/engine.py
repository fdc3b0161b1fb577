"""The Transfer Engine facade: registered memory, segments, and the transports behind them.

Batches, submission and status live in :class:`transfer.batches.BatchMixin`; this file owns the
engine's resources. Each engine has one RAM segment, named ``host:rpc_port`` under P2P handshake
(the name *is* how peers reach it) or any name when a master serves metadata. Everything the
engine opens (RPC server, listeners, connections, shared-memory regions, threads) is released by
:meth:`close`; shared-memory regions left by engines that died are removed at start-up.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Any

from transfer.batch import OpCode, Slice, Task
from transfer.batches import BatchMixin
from transfer.descriptor import SegmentDescriptor, local_host_id
from transfer.engine_options import EngineOptions
from transfer.errors import AddressNotRegistered, DeviceNotFound, MemoryLockLimit, MooncakeError
from transfer.gpu.cuda_memory import gpudirect_available
from transfer.gpu.device_memory import DeviceBuffer, device_buffer_of, view_address
from transfer.memory import MemoryRegistry, RegisteredBuffer, address_of, as_byte_view
from transfer.metadata.client import EXCHANGE_OP, P2P, LocalMetadata, MasterMetadata, MetadataBackend, P2PMetadata
from transfer.metadata.segment_cache import SegmentCache
from transfer.metadata.table import MetadataTable
from transfer.path_selection import PathSet
from transfer.rdma import verbs_pyverbs
from transfer.rdma.handshake import CONNECT_OP
from transfer.rdma import probe as rdma_probe
from transfer.rdma.transport import RdmaTransport
from transfer.rdma.verbs import Verbs, VerbsUnavailable
from transfer.rpc.client_server import Request, RpcServer
from transfer.shm.region import SharedRegion, remove_orphans
from transfer.shm.transport import ShmTransport
from transfer.tcp.transport import TcpTransport
from transfer.transport import Transport

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)
_warned: set[str] = set()  # fallback reasons already logged by this process


class TransferEngine(BatchMixin):
    def __init__(
        self,
        name: str | None = None,
        *,
        metadata: str | MetadataTable | MetadataBackend = P2P,
        options: EngineOptions | None = None,
        host: str = "127.0.0.1",
        listen: list[tuple[str, str]] | None = None,
        topology: dict | None = None,
        verbs: Verbs | None = None,
        gpudirect: bool | None = None,
    ) -> None:
        """``metadata``: "P2PHANDSHAKE", a master's RPC address ("tcp://h:p"), a MetadataTable
        in this process, or any backend object. ``listen``: (NIC, address) pairs the TCP
        transport serves on (default: ``host`` as NIC "lo"). ``topology``: the matrix
        ``{location: [[preferred NICs], [secondary NICs]]}`` (default: every listen NIC).
        ``verbs``: the RDMA provider (default: pyverbs, loaded only for protocol auto or rdma).
        ``gpudirect``: whether the NICs can address GPU memory (default: probed)."""
        self.options = options or EngineOptions()
        self.rdma_unavailable = ""  # why this engine runs without RDMA although it may use it
        rdma_devices = self._probe_rdma(verbs)
        remove_orphans()
        self.incarnation = uuid.uuid4().hex
        self.host_id = local_host_id()
        self.memory = MemoryRegistry()
        self._owned: dict[int, SharedRegion] = {}
        self._region_ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._stop_refresh = threading.Event()
        listen = listen or [("lo" if host.startswith("127.") else "nic0", host)]
        self.topology = topology or {"*": [[nic for nic, _ in listen], []]}
        self.paths = PathSet(self.topology, self.options.path_cooldown)
        self._rpc = RpcServer(f"tcp://{host}:*", secret=self.options.secret)
        self.rpc_address = self._rpc.address
        self.name = name or self.rpc_address.rsplit("/", 1)[-1]
        self._metadata = self._backend(metadata)
        self.segments = SegmentCache(self._metadata, self._forget_peer)
        super().__init__()
        self.transports: list[Transport] = []
        if self.options.protocol in ("auto", "shm"):
            self.transports.append(ShmTransport(self.host_id, self, self.options.shm_copy_threads))
        self._rdma: RdmaTransport | None = None
        if rdma_devices:
            self._rdma = RdmaTransport(
                rdma_devices, lambda: (self.name, self.incarnation), self, self.topology,
                slice_size=self.options.rdma_slice_size,
                qps_per_endpoint=self.options.rdma_qps_per_endpoint,
                pool_size=self.options.endpoint_pool_size,
                handshake_timeout=self.options.handshake_timeout,
                path_cooldown=self.options.path_cooldown,
                gpudirect=gpudirect_available() if gpudirect is None else gpudirect,
                secret=self.options.secret)
            self.transports.append(self._rdma)
            self._rpc.register(CONNECT_OP, self._rdma.accept, blocking=True)
        if self.options.protocol in ("auto", "tcp"):
            self.transports.append(TcpTransport(
                self.memory, lambda: (self.name, self.incarnation), self, self.paths,
                {nic: address for nic, address in listen}, listen,
                streams_per_path=self.options.streams_per_path,
                pool_size=self.options.endpoint_pool_size,
                handshake_timeout=self.options.handshake_timeout,
                slice_timeout=self.options.slice_timeout,
                secret=self.options.secret, busy_poll=self.options.tcp_busy_poll))
        self._rpc.register(EXCHANGE_OP, self._exchange)
        self._rpc.start()
        # A tenant's engine (transfer.auth.TenantCredential) only initiates: nobody is to reach
        # its memory, and the master keeps tenants from writing the descriptor table others trust.
        self.publishes = self.options.secret is None or self.options.secret.tenant is None
        self.version = self._metadata.publish(self.descriptor()) if self.publishes else 0
        if self.publishes:
            threading.Thread(target=self._refresh_loop, name="te-meta-refresh", daemon=True).start()

    def _probe_rdma(self, verbs: Verbs | None) -> list:
        """Usable RDMA devices; under ``auto`` none (and the reason kept) when RDMA is absent."""
        if self.options.protocol not in ("auto", "rdma"):
            return []
        absent = rdma_probe.kernel_lists_no_device() if verbs is None and self.options.protocol == "auto" else None
        if absent:
            self._fall_back(absent)
            return []
        try:
            return rdma_probe.open_devices(verbs or verbs_pyverbs.load(), self.options.rdma_gid_index,
                                           self.options.rdma_mtu)
        except VerbsUnavailable as exc:
            if self.options.protocol == "rdma":
                raise DeviceNotFound(str(exc)) from None
            self._fall_back(str(exc))
            return []

    def _fall_back(self, reason: str) -> None:
        self.rdma_unavailable = reason
        if reason not in _warned:
            _warned.add(reason)
            log.warning("RDMA unavailable, transfers use TCP: %s", reason)

    def status(self) -> dict:
        """Which transports carry transfers, and why RDMA does not when it does not."""
        rdma = self._rdma
        return {"name": self.name, "protocol": self.options.protocol,
                "transports": [t.name for t in self.transports if not getattr(t, "disabled", "")],
                "rdma_devices": [d.name for d in rdma.device_descs()] if rdma else [],
                "rdma_unavailable": self.rdma_unavailable}

    def _backend(self, metadata: Any) -> MetadataBackend:
        if isinstance(metadata, MetadataTable):
            return LocalMetadata(metadata)
        if metadata == P2P:
            return P2PMetadata(self.descriptor, timeout=self.options.handshake_timeout,
                               secret=self.options.secret)
        if isinstance(metadata, str):
            return MasterMetadata(metadata, timeout=self.options.handshake_timeout,
                                  secret=self.options.secret)
        return metadata

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop_refresh.set()
            owned = list(self._owned.values())
            self._owned.clear()
        try:
            if self.publishes:
                self._metadata.withdraw(self.descriptor())
        except Exception:  # the master may already be gone; our regions still must be freed
            pass
        for transport in self.transports:
            transport.close()
        self._rpc.stop(drain_timeout=0.5)
        self._metadata.close()
        for region in owned:
            region.close()

    # -- memory -----------------------------------------------------------------------------------

    def register_local_memory(self, buffer: Any, location: str = "cpu:0", *,
                              remote_accessible: bool = True, update_metadata: bool = True) -> int:
        """Make ``buffer`` usable in transfers; returns its address. Overlaps are refused.
        GPU memory (torch CUDA tensors, cupy arrays) takes its ``cuda:N`` location from the
        object; its address is the device pointer."""
        device = device_buffer_of(buffer)
        if device is not None:
            address = self._register_device_memory(device, remote_accessible)
        else:
            view, address = as_byte_view(buffer)
            self._add(RegisteredBuffer(address, view.nbytes, location, view,
                                       remote_accessible=remote_accessible), address)
        if update_metadata:
            self._publish()
        return address

    def _register_device_memory(self, device: DeviceBuffer, remote_accessible: bool) -> int:
        """A pinned host mirror always (shm and TCP stage through it); the NIC addresses the GPU
        directly under GPUDirect RDMA, else the mirror, which peers cannot reach: the buffer
        is then published local-only."""
        direct = self._rdma is not None and self._rdma.gpudirect
        if remote_accessible and not direct:
            log.warning("%s buffer at %#x is staged through pinned host memory and registered "
                        "local-only: peers reach GPU memory only through GPUDirect RDMA",
                        device.location, device.pointer)
        mirror = device.pinned_host()
        self._add(RegisteredBuffer(device.pointer, device.nbytes, device.location, mirror,
                                   remote_accessible=remote_accessible and direct, device=device),
                  device.pointer if direct else view_address(mirror))
        return device.pointer

    def _add(self, buffer: RegisteredBuffer, mr_address: int) -> None:
        """Registry first (it refuses overlaps), then a memory region on every RDMA device."""
        self.memory.add(buffer)
        if self._rdma is None or self._rdma.disabled:
            return
        try:
            buffer.rkeys = self._rdma.register(buffer.view, mr_address)
        except MemoryLockLimit as exc:
            if self.options.protocol == "rdma":
                self.memory.remove(buffer.address)
                raise
            self._rdma.disable(str(exc))
            self._fall_back(str(exc))

    def unregister_local_memory(self, buffer_or_address: Any, *, update_metadata: bool = True) -> None:
        address = (buffer_or_address if isinstance(buffer_or_address, int)
                   else address_of(buffer_or_address))
        buffer = self.memory.remove(address)
        if self._rdma is not None and buffer.rkeys:
            self._rdma.deregister(buffer.view)
        with self._lock:
            region = self._owned.pop(address, None)
        if region is not None:
            region.close()
        if update_metadata:
            self._publish()

    def allocate_shared_buffer(self, length: int, location: str = "cpu:0", *,
                               commit: bool = False) -> np.ndarray:
        """Registered memory in a named shared-memory region, so same-host peers copy directly.
        ``commit``: take and map all of its memory now (see :class:`SharedRegion`). Freed by
        ``unregister_local_memory`` or ``close``."""
        region = SharedRegion(SharedRegion.owned_name(self.incarnation[:12], next(self._region_ids),
                                                      self.options.shm_prefix),
                              length, create=True, commit=commit)
        view, address = as_byte_view(region.view)
        try:
            self._add(RegisteredBuffer(address, length, location, view, shm_name=region.name), address)
        except Exception:
            region.close()
            raise
        with self._lock:
            self._owned[address] = region
        self._publish()
        import numpy as np  # here, not at the top: an engine that moves only small objects needs none of it

        return np.frombuffer(region.view, dtype=np.uint8)

    def buffer_at(self, address: int, length: int) -> memoryview:
        """A host view of registered local memory holding its current bytes (AddressNotRegistered
        outside it). For GPU memory the view is the pinned mirror, into which the range is first
        copied from the device (what a checksum of the bytes to put must read); bytes written
        into that view reach the device through :meth:`copy_to_device`."""
        buffer = self.memory.find(address, length)
        start = address - buffer.address
        if buffer.device is not None:
            buffer.device.to_host(buffer.view, start, length)
        return buffer.view[start:start + length]

    def host_views(self, addresses: list[int], lengths: list[int]) -> list[memoryview | None]:
        """Per range, a view of the registered host memory holding it, or None for GPU memory
        (whose bytes only :meth:`buffer_at`'s mirror shows); AddressNotRegistered outside
        registered memory. The registry is searched once per buffer, not once per range: the
        ranges of a batch mostly lie in one or two buffers."""
        views: list[memoryview | None] = []
        # The current buffer's bounds, view and kind in locals, not looked up per range; no
        # range lies in [1, 0], so the first one looks its buffer up.
        low, high, view, host = 1, 0, None, True
        for address, length in zip(addresses, lengths):
            if not low <= address <= high - length:
                buffer = self.memory.find(address, length)
                low, high, view, host = buffer.address, buffer.end, buffer.view, buffer.device is None
            views.append(view[address - low:address - low + length] if host else None)
        return views

    def copy_to_device(self, address: int, length: int) -> None:
        """After bytes were written into :meth:`buffer_at`'s view of GPU memory (not by a
        transfer, which stages its own): copy the range to the device. Host memory: nothing."""
        buffer = self.memory.find(address, length)
        if buffer.device is not None:
            buffer.device.from_host(buffer.view, address - buffer.address, length)

    # -- segments ---------------------------------------------------------------------------------

    def descriptor(self) -> SegmentDescriptor:
        tcp = [t for t in getattr(self, "transports", []) if t.name == "tcp"]
        return SegmentDescriptor(
            name=self.name, incarnation=self.incarnation, host_id=self.host_id,
            rpc_address=self.rpc_address,
            endpoints=tcp[0].endpoints() if tcp else [],
            buffers=[b.describe() for b in self.memory.all() if b.remote_accessible],
            priority_matrix=self.topology, version=getattr(self, "version", 0),
            rdma_devices=rdma.device_descs() if (rdma := getattr(self, "_rdma", None)) else [])

    def open_segment(self, name: str) -> int:
        return self.segments.open(name)

    def close_segment(self, handle: int) -> None:
        self.segments.close(handle)

    def segment_descriptor(self, handle_or_name: int | str) -> SegmentDescriptor:
        if isinstance(handle_or_name, int):
            return self.segments.get(handle_or_name)
        return self.segments.descriptor_of(handle_or_name)

    def sync_segment_cache(self, name: str | None = None) -> None:
        self.segments.sync(name)

    def republish(self) -> None:
        """Publish our descriptor again: after the metadata service restarted empty."""
        self._publish()

    def _publish(self) -> None:
        if self.publishes:
            self.version = self._metadata.publish(self.descriptor())

    def _refresh_loop(self) -> None:
        """Publish our descriptor again every fifth of the metadata TTL: the master's table drops
        descriptors not refreshed within it (engines that died without withdrawing)."""
        while not self._stop_refresh.wait(self.options.metadata_ttl / 5):
            try:
                self._publish()
            except MooncakeError as exc:  # the master may be restarting: the next round retries
                log.debug("could not refresh our segment descriptor: %s", exc)

    def _exchange(self, request: Request) -> dict:
        """P2P handshake: learn the caller's descriptor, answer with ours."""
        peer = request.args.get("descriptor")
        if peer:
            self.segments.learn(SegmentDescriptor.from_wire(peer))
        return self.descriptor().to_wire()

    # -- GPU staging: device -> mirror before a WRITE leaves, mirror -> device after a READ ------

    def _slices(self, task: Task, local: RegisteredBuffer, peer: SegmentDescriptor,
                transport: Transport) -> list[Slice]:
        pieces = super()._slices(task, local, peer, transport)
        request = task.request
        if request.opcode == OpCode.WRITE and local.location.startswith("cuda") and self._staged(local, transport):
            local.device.to_host(local.view, request.source - local.address, request.length)
        return pieces

    def done(self, piece: Slice) -> None:
        if piece.opcode == OpCode.READ and piece.location.startswith("cuda"):
            buffer = piece.local_buffer
            if self._staged(buffer, piece.transport):
                buffer.device.from_host(buffer.view, piece.local_offset, piece.length)
        super().done(piece)

    def _staged(self, buffer: RegisteredBuffer, transport: Transport) -> bool:
        return buffer.device is not None and not (transport is self._rdma and self._rdma.gpudirect)

    def _forget_peer(self, name: str) -> None:
        for transport in self.transports:
            transport.forget_peer(name)

    def check_address(self, address: int, length: int) -> RegisteredBuffer:
        try:
            return self.memory.find(address, length)
        except AddressNotRegistered:
            raise AddressNotRegistered(
                f"[{address:#x}, +{length}): memory region not registered by this engine") from None
