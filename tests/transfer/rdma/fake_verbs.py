"""A stand-in for pyverbs behind the :mod:`transfer.rdma.verbs` seam: RDMA as memory copies.

One :class:`Fabric` joins the devices of every engine in a test. Memory regions and queue pairs
get fabric-wide keys and numbers; a posted WRITE/READ is checked the way an HCA would (keys and
bounds of both regions, the remote QP connected back to this one with matching PSNs and MTU,
both links up) and then performed with ``ctypes.memmove``; its completion waits in the device's
completion queue until the transport's poller takes it. A broken link fails what is posted
through it and leaves the QP in error, as a real RC QP does.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import threading

from transfer.rdma.verbs import Completion, GidEntry, MemoryKeys, Op, PortInfo, QpTarget, VerbsUnavailable


class Fabric:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.regions: dict[int, tuple[int, int]] = {}  # key -> (address, length)
        self.qps: dict[int, FakeQueuePair] = {}
        self.broken: set[tuple[str, str]] = set()  # (host, device)
        self.posts: list[tuple[str, str, int]] = []  # (host, device, length) of every WR
        self.hold = threading.Event()  # set: completions wait in the queue until cleared
        self._keys = itertools.count(0x1000)
        self._qpns = itertools.count(0x40)

    def key(self) -> int:
        return next(self._keys)

    def qpn(self) -> int:
        return next(self._qpns)


class FakeVerbs:
    def __init__(self, fabric: Fabric, host: str, devices: list[str], *, mtu: int = 4096,
                 port_state: str = "ACTIVE", gids: list[GidEntry] | None = None) -> None:
        self.fabric, self.host, self.devices = fabric, host, devices
        self.mtu, self.port_state, self.gids = mtu, port_state, gids
        self.opened: list[FakeDevice] = []

    def device_names(self) -> list[str]:
        if not self.devices:
            raise VerbsUnavailable("no RDMA device on this host (libibverbs lists none)")
        return list(self.devices)

    def open(self, name: str) -> FakeDevice:
        device = FakeDevice(self, name)
        self.opened.append(device)
        return device


class FakeDevice:
    def __init__(self, verbs: FakeVerbs, name: str) -> None:
        self.verbs, self.name, self.fabric = verbs, name, verbs.fabric
        self.host = verbs.host
        self.lid = self.fabric.key() & 0xFFFF
        self.gid = f"0000:0000:0000:0000:0000:ffff:0a00:{self.lid:04x}"
        self.cq: collections.deque[Completion] = collections.deque()
        self.closed = False

    def ports(self) -> list[PortInfo]:
        state = self.verbs.port_state
        return [PortInfo(1, state == "ACTIVE", state, self.lid, "Ethernet", self.verbs.mtu)]

    def gids(self, port: int) -> list[GidEntry]:
        if self.verbs.gids is not None:
            return self.verbs.gids
        return [GidEntry(0, "fe80:0000:0000:0000:0000:0000:0000:0001", False),
                GidEntry(3, self.gid, True)]

    def register(self, address: int, length: int) -> tuple[MemoryKeys, object]:
        key = self.fabric.key()
        with self.fabric.lock:
            self.fabric.regions[key] = (address, length)
        return MemoryKeys(key, key), key

    def deregister(self, handle: object) -> None:
        with self.fabric.lock:
            self.fabric.regions.pop(handle, None)

    def create_qp(self, max_wr: int) -> FakeQueuePair:
        qp = FakeQueuePair(self)
        with self.fabric.lock:
            self.fabric.qps[qp.qpn] = qp
        return qp

    def poll(self, max_entries: int) -> list[Completion]:
        if self.fabric.hold.is_set():
            return []
        polled = []
        while self.cq and len(polled) < max_entries:
            polled.append(self.cq.popleft())
        return polled

    def close(self) -> None:
        self.closed = True


class FakeQueuePair:
    def __init__(self, device: FakeDevice) -> None:
        self.device, self.qpn = device, device.fabric.qpn()
        self.target: QpTarget | None = None
        self.error = False
        self.closed = False

    def connect(self, target: QpTarget) -> None:
        self.target = target

    def post(self, wr_id: int, op: Op, local_address: int, length: int, lkey: int,
             remote_address: int, rkey: int) -> None:
        fabric = self.device.fabric
        with fabric.lock:
            fabric.posts.append((self.device.host, self.device.name, length))
            status = self._check(local_address, length, lkey, remote_address, rkey)
            if status == "IBV_WC_SUCCESS":
                source, destination = ((local_address, remote_address) if op == Op.WRITE
                                       else (remote_address, local_address))
                ctypes.memmove(destination, source, length)
            else:
                self.error = True
        self.device.cq.append(Completion(wr_id, status == "IBV_WC_SUCCESS", status))

    def _check(self, local_address: int, length: int, lkey: int, remote_address: int, rkey: int) -> str:
        fabric, target = self.device.fabric, self.target
        if self.error:
            return "IBV_WC_WR_FLUSH_ERR"
        remote = fabric.qps.get(target.remote_qpn) if target else None
        if remote is None or remote.closed or remote.target is None:
            return "IBV_WC_RETRY_EXC_ERR"
        if {(self.device.host, self.device.name), (remote.device.host, remote.device.name)} & fabric.broken:
            return "IBV_WC_RETRY_EXC_ERR"
        back = remote.target
        if (back.remote_qpn != self.qpn or back.remote_psn != target.local_psn
                or target.remote_psn != back.local_psn or back.mtu != target.mtu
                or target.remote_gid != remote.device.gid or target.remote_lid != remote.device.lid):
            return "IBV_WC_RETRY_EXC_ERR"  # a handshake mismatch: packets never match up
        if not _inside(fabric.regions.get(lkey), local_address, length):
            return "IBV_WC_LOC_PROT_ERR"
        if not _inside(fabric.regions.get(rkey), remote_address, length):
            return "IBV_WC_REM_ACCESS_ERR"
        return "IBV_WC_SUCCESS"

    def close(self) -> None:
        self.closed = True


def _inside(region: tuple[int, int] | None, address: int, length: int) -> bool:
    return region is not None and region[0] <= address and address + length <= region[0] + region[1]
