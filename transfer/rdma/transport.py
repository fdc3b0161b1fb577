"""The RDMA transport: RDMA WRITE/READ between registered memory through a :class:`Verbs` provider.

Per device: one context, protection domain and completion queue (the provider's Device), and a
memory region for every registered buffer, whose remote keys go into our segment descriptor.
A slice picks a (local device, peer device) pair (:mod:`transfer.rdma.device_selection`), finds or
handshakes the endpoint for that pair (:mod:`transfer.rdma.handshake`) and is posted as
``slice_size`` work requests. Two threads keep ``submit`` off the network: a poster (endpoint
set-up may wait for the peer's RPC reply) and a poller that drains the completion queues and
reports each slice once. A failed slice goes back to the engine, which retries it here on the
next pair while the failing endpoint is rebuilt.
"""

from __future__ import annotations

import bisect
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable

from transfer.auth import Credential
from transfer.batch import OpCode, Slice
from transfer.batch import cut
from transfer.descriptor import BufferDesc, RdmaDeviceDesc, SegmentDescriptor
from transfer.errors import AddressNotRegistered, DeviceNotFound, InvalidArgument, MalformedMessage
from transfer.gpu.device_memory import view_address
from transfer.path_selection import PathSet
from transfer.rdma import probe
from transfer.rdma.device_selection import peer_device, rdma_matrix
from transfer.rdma.endpoint import Endpoint, EndpointKey, Flight
from transfer.rdma.handshake import CONNECT_OP, QpInfo, local_info, target_for
from transfer.rdma.probe import DevicePlan, check_memlock
from transfer.rdma.verbs import Completion, Device, MemoryKeys, Op, QueuePair
from transfer.rpc.client_server import Request, RpcClient
from transfer.sieve import SieveCache
from transfer.transport import SliceSink, Transport

MAX_WR = 256  # outstanding work requests per QP (Mooncake's max_wr)
_POLL_BATCH = 64
_IDLE_WAIT = 0.05  # poller sleep when nothing is in flight (woken by the first post)
_BUSY_WAIT = 0.0002  # poller pause between empty polls while work is in flight


@dataclass
class _Region:
    host_address: int  # where slices' host views point
    length: int
    mr_address: int  # what the NIC addresses: the same, or the GPU pointer under GPUDirect
    keys: dict[str, MemoryKeys]
    handles: dict[str, object]


class RdmaTransport(Transport):
    name = "rdma"

    def __init__(self, devices: list[tuple[Device, DevicePlan]], identity: Callable[[], tuple[str, str]],
                 sink: SliceSink, matrix: dict, *, slice_size: int, qps_per_endpoint: int,
                 pool_size: int, handshake_timeout: float, path_cooldown: float, gpudirect: bool,
                 secret: Credential | None = None) -> None:
        self._devices = {plan.name: (device, plan) for device, plan in devices}
        self._identity, self._sink = identity, sink
        self.paths = PathSet(rdma_matrix(matrix, list(self._devices)), path_cooldown)
        self._slice_size, self._qps_per_endpoint = slice_size, qps_per_endpoint
        self._handshake_timeout = handshake_timeout
        self._secret = secret
        self.gpudirect = gpudirect
        self.disabled = ""  # why the engine stopped choosing this transport, if it did
        self._lock = threading.Lock()
        self._regions: list[_Region] = []  # sorted by host_address
        self._pinned = 0
        self._pool: SieveCache[EndpointKey, Endpoint] = SieveCache(pool_size)
        self._accepted: dict[EndpointKey, list[QueuePair]] = {}
        self._in_flight: dict[int, Flight] = {}
        self._wr_ids = itertools.count(1)
        self._queue: queue.SimpleQueue[Slice | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._work = threading.Event()
        self.num_handshakes = 0
        self._threads = [threading.Thread(target=self._post_loop, name="rdma-post", daemon=True),
                         threading.Thread(target=self._poll_loop, name="rdma-poll", daemon=True)]
        for thread in self._threads:
            thread.start()

    # -- what the engine publishes and registers --------------------------------------------------

    def device_descs(self) -> list[RdmaDeviceDesc]:
        return [RdmaDeviceDesc(plan.name, plan.lid, plan.gid) for _, plan in self._devices.values()]

    def register(self, host: memoryview, mr_address: int) -> tuple[tuple[str, int], ...]:
        """Register a buffer on every device (MemoryLockLimit past ``ulimit -l``); its rkeys."""
        length = host.nbytes
        with self._lock:
            check_memlock(self._pinned, length, probe.memlock_limit())
            self._pinned += length
        region = _Region(view_address(host), length, mr_address, {}, {})
        try:
            for name, (device, _) in self._devices.items():
                region.keys[name], region.handles[name] = device.register(mr_address, length)
        except Exception:
            self._release(region)
            raise
        with self._lock:
            index = bisect.bisect([r.host_address for r in self._regions], region.host_address)
            self._regions.insert(index, region)
        return tuple((name, keys.rkey) for name, keys in region.keys.items())

    def deregister(self, host: memoryview) -> None:
        address = view_address(host)
        with self._lock:
            region = next((r for r in self._regions if r.host_address == address), None)
            if region is not None:
                self._regions.remove(region)
        if region is not None:
            self._release(region)

    def _release(self, region: _Region) -> None:
        for name, handle in region.handles.items():
            self._devices[name][0].deregister(handle)
        with self._lock:
            self._pinned -= region.length

    def _local(self, view: memoryview, device: str) -> tuple[int, int]:
        """(address the NIC uses, lkey) of a slice's local bytes."""
        address = view_address(view)
        with self._lock:
            index = bisect.bisect([r.host_address for r in self._regions], address) - 1
            region = self._regions[index] if index >= 0 else None
        if region is None or address + view.nbytes > region.host_address + region.length:
            raise AddressNotRegistered(f"[{address:#x}, +{view.nbytes}) has no RDMA memory region")
        return region.mr_address + (address - region.host_address), region.keys[device].lkey

    # -- Transport ---------------------------------------------------------------------------------

    def reaches(self, peer: SegmentDescriptor, buffer: BufferDesc) -> bool:
        return (not self.disabled and bool(buffer.rkeys) and bool(peer.rdma_devices)
                and bool(peer.rpc_address))

    def disable(self, reason: str) -> None:
        """Carry no new transfers (endpoints and memory regions stay until close)."""
        self.disabled = reason

    def submit(self, pieces: list[Slice]) -> None:
        for piece in pieces:
            self._queue.put(piece)

    def _post_loop(self) -> None:
        while (piece := self._queue.get()) is not None:
            self._start(piece)

    def _start(self, piece: Slice) -> None:
        local_device = None
        try:
            local_device = self.paths.choose(piece.location, piece.index, piece.attempt, time.monotonic())
            remote = piece.peer.find_buffer(piece.remote_address, piece.length)
            remote_device = peer_device(piece.peer, remote, piece.index, piece.attempt)
            local_address, lkey = self._local(piece.local, local_device)
            endpoint = self._endpoint(piece.peer, local_device, remote_device)
        except (InvalidArgument, AddressNotRegistered) as exc:  # no other pair fixes these
            self._sink.failed(piece, f"rdma: {exc}", None, fatal=True)
            return
        except Exception as exc:  # noqa: BLE001 - handshake or device trouble: retry elsewhere
            self._sink.failed(piece, f"rdma endpoint {local_device} -> {piece.peer.name}: {exc}",
                              local_device)
            return
        rkey = dict(remote.rkeys)[remote_device]
        op = Op.WRITE if piece.opcode == OpCode.WRITE else Op.READ
        requests = cut(piece.length, self._slice_size, 0)
        flight = Flight(piece, endpoint, len(requests))
        for offset, length in requests:
            wr_id = next(self._wr_ids)
            with self._lock:
                self._in_flight[wr_id] = flight
            self._work.set()
            try:
                endpoint.post(wr_id, op, local_address + offset, length, lkey,
                              piece.remote_address + offset, rkey)
            except Exception as exc:  # noqa: BLE001 - a refused post means a QP in error
                with self._lock:
                    self._in_flight.pop(wr_id, None)
                self._fail(flight, f"post refused: {exc}")
                return

    def _endpoint(self, peer: SegmentDescriptor, local_device: str, remote_device: str) -> Endpoint:
        key = (peer.name, peer.incarnation, local_device, remote_device)
        with self._lock:
            endpoint = self._pool.get(key)
        if endpoint is not None and not endpoint.broken:
            return endpoint
        device, plan = self._devices[local_device]
        qps = [device.create_qp(MAX_WR) for _ in range(self._qps_per_endpoint)]
        try:
            mine = [local_info(plan, qp.qpn) for qp in qps]
            name, incarnation = self._identity()
            with RpcClient(peer.rpc_address, timeout=self._handshake_timeout, secret=self._secret) as client:
                reply = client.call(CONNECT_OP, {
                    "initiator": name, "incarnation": incarnation, "device": local_device,
                    "peer_device": remote_device, "qps": [info.to_wire() for info in mine]})
            theirs = [QpInfo.from_wire(info) for info in reply.get("qps", [])]
            if len(theirs) != len(qps):
                raise MalformedMessage(f"peer answered {len(theirs)} QPs for our {len(qps)}")
            for qp, local, remote in zip(qps, mine, theirs):
                qp.connect(target_for(plan, local, remote))
        except Exception:
            for qp in qps:
                qp.close()
            raise
        endpoint = Endpoint(key, qps)
        with self._lock:
            self.num_handshakes += 1
            evicted = self._pool.put(key, endpoint)
        for _, old in evicted:
            old.break_()
        return endpoint

    def accept(self, request: Request) -> dict:
        """The peer side of the handshake (the ``te.rdma.connect`` op)."""
        args = request.args
        device_name = str(args.get("peer_device"))
        if device_name not in self._devices:
            raise DeviceNotFound(f"no RDMA device {device_name!r} here (have {sorted(self._devices)})")
        device, plan = self._devices[device_name]
        theirs = [QpInfo.from_wire(info) for info in args.get("qps") or []]
        if not theirs:
            raise MalformedMessage("RDMA handshake without queue pairs")
        qps = [device.create_qp(MAX_WR) for _ in theirs]
        mine = [local_info(plan, qp.qpn) for qp in qps]
        try:
            for qp, local, remote in zip(qps, mine, theirs):
                qp.connect(target_for(plan, local, remote))
        except Exception:
            for qp in qps:
                qp.close()
            raise
        key = (str(args.get("initiator")), str(args.get("incarnation")), str(args.get("device")), device_name)
        with self._lock:
            replaced = self._accepted.pop(key, [])  # a rebuilt endpoint replaces the failed one
            self._accepted[key] = qps
        for qp in replaced:
            qp.close()
        return {"qps": [info.to_wire() for info in mine]}

    # -- completions -------------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            polled = [c for device, _ in self._devices.values() for c in device.poll(_POLL_BATCH)]
            for completion in polled:
                self._complete(completion)
            if polled:
                continue
            with self._lock:
                idle = not self._in_flight
            if idle:
                self._work.clear()
                self._work.wait(_IDLE_WAIT)
            else:
                time.sleep(_BUSY_WAIT)

    def _complete(self, completion: Completion) -> None:
        with self._lock:
            flight = self._in_flight.pop(completion.wr_id, None)
        if flight is None:
            return
        if not completion.ok:
            self._fail(flight, completion.status)
        elif flight.request_done():
            self._sink.done(flight.piece)
        flight.endpoint.completed()

    def _fail(self, flight: Flight, reason: str) -> None:
        endpoint = flight.endpoint
        with self._lock:
            if self._pool.get(endpoint.key) is endpoint:
                self._pool.pop(endpoint.key)
        endpoint.break_()
        if flight.request_failed():
            peer, _, local_device, remote_device = endpoint.key
            self._sink.failed(flight.piece, f"rdma {local_device} -> {peer}@{remote_device}: {reason}",
                              local_device)

    # -- lifecycle ---------------------------------------------------------------------------------

    def forget_peer(self, peer_name: str) -> None:
        with self._lock:
            stale = [e for e in self._pool.values() if e.key[0] == peer_name]
            for endpoint in stale:
                self._pool.pop(endpoint.key)
            accepted = [k for k in self._accepted if k[0] == peer_name]
            qps = [qp for k in accepted for qp in self._accepted.pop(k)]
        for endpoint in stale:
            endpoint.break_()
        for qp in qps:
            qp.close()

    def num_endpoints(self) -> int:
        with self._lock:
            return len(self._pool)

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._work.set()
        for thread in self._threads:
            thread.join(timeout=2)
        with self._lock:
            endpoints = self._pool.values()
            qps = [qp for group in self._accepted.values() for qp in group]
            self._accepted.clear()
            regions, self._regions = self._regions, []
        for endpoint in endpoints:
            endpoint.close()
        for qp in qps:
            qp.close()
        for region in regions:
            self._release(region)
        for device, _ in self._devices.values():
            device.close()
