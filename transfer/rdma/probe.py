"""Start-up checks of the RDMA transport, each failing with a message that says what to fix.

In order: pyverbs importable (:func:`transfer.rdma.verbs_pyverbs.load`), a device listed, a device
with an ACTIVE port, a usable GID, an MTU the port supports; then, whenever memory is
registered, the locked-memory limit (``ulimit -l``), because every registered byte is pinned.
The GID index and MTU are probed per device (a RoCEv2 GID preferred, the port's active MTU) and
can be forced by the ``rdma_gid_index`` / ``rdma_mtu`` settings.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from transfer.errors import MemoryLockLimit
from transfer.rdma.verbs import MTUS, ZERO_GID, Device, GidEntry, PortInfo, Verbs, VerbsUnavailable
from transfer.settings import format_size

_CAP_IPC_LOCK = 14  # a process with this capability may pin memory past RLIMIT_MEMLOCK
SYSFS_DEVICES = "/sys/class/infiniband"


def kernel_lists_no_device() -> str | None:
    """Why there is no RDMA device, when the kernel lists none; else None. Without one,
    libibverbs finds none either, so a caller that only tries RDMA (protocol auto) can skip
    importing pyverbs (about 11 ms of every short-lived client's start)."""
    try:
        listed = os.listdir(SYSFS_DEVICES)
    except OSError:
        listed = []
    return None if listed else f"no RDMA device on this host ({SYSFS_DEVICES} lists none)"


@dataclass(frozen=True)
class DevicePlan:
    """How this process uses one device: port, addressing and MTU, as the handshake sends them."""

    name: str
    port: int
    lid: int
    gid_index: int
    gid: str
    mtu: int


def open_devices(verbs: Verbs, gid_index: int = -1, mtu: int = 0) -> list[tuple[Device, DevicePlan]]:
    """Every usable device with its plan; VerbsUnavailable naming why each one is not usable."""
    opened, reasons = [], []
    for name in verbs.device_names():
        device = verbs.open(name)
        try:
            opened.append((device, plan_device(device, gid_index, mtu)))
        except VerbsUnavailable as exc:
            reasons.append(str(exc))
            device.close()
    if not opened:
        raise VerbsUnavailable("no usable RDMA device: " + "; ".join(reasons))
    return opened


def plan_device(device: Device, gid_index: int, mtu: int) -> DevicePlan:
    ports = device.ports()
    active = [p for p in ports if p.active]
    if not active:
        states = ", ".join(f"port {p.number} is {p.state}" for p in ports) or "it has no ports"
        raise VerbsUnavailable(f"{device.name} has no active port ({states})")
    port = active[0]
    gid = _choose_gid(device.name, port, device.gids(port.number), gid_index)
    return DevicePlan(device.name, port.number, port.lid, gid.index, gid.gid,
                      _choose_mtu(device.name, port, mtu))


def _choose_gid(name: str, port: PortInfo, gids: list[GidEntry], forced: int) -> GidEntry:
    if forced >= 0:
        for entry in gids:
            if entry.index == forced:
                return entry
        raise VerbsUnavailable(f"{name} port {port.number} has no GID at index {forced} "
                               f"(rdma_gid_index); valid: {[g.index for g in gids]}")
    # RoCEv2 routes over IP; among its GIDs an IPv4-mapped one (::ffff:a.b.c.d) is the usual choice.
    ranked = sorted(gids, key=lambda g: (not g.roce_v2, not g.gid.startswith("0000:0000:0000:0000:0000:ffff"),
                                         g.index))
    if ranked:
        return ranked[0]
    if port.link_layer == "Ethernet":
        raise VerbsUnavailable(f"{name} port {port.number} (RoCE) has no GID: configure an IP "
                               "address on its network interface")
    return GidEntry(0, ZERO_GID, False)  # InfiniBand without GIDs: connections route by LID


def _choose_mtu(name: str, port: PortInfo, forced: int) -> int:
    if not forced:
        return port.active_mtu
    if forced not in MTUS:
        raise VerbsUnavailable(f"rdma_mtu {forced} is not an RDMA MTU (one of {MTUS})")
    if forced > port.active_mtu:
        raise VerbsUnavailable(f"rdma_mtu {forced} exceeds {name} port {port.number}'s active "
                               f"MTU {port.active_mtu}")
    return forced


def memlock_limit() -> int | None:
    """Bytes this process may pin, or None when unlimited (or CAP_IPC_LOCK lifts the limit)."""
    if _has_ipc_lock():
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def _has_ipc_lock() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


def check_memlock(pinned: int, adding: int, limit: int | None) -> None:
    """Refuse a registration that would pin more than ``ulimit -l`` allows, before the kernel
    refuses it with a bare ENOMEM."""
    if limit is None or pinned + adding <= limit:
        return
    raise MemoryLockLimit(
        f"locked-memory limit (ulimit -l) is {format_size(limit)} but RDMA registration needs "
        f"{format_size(pinned + adding)} ({format_size(pinned)} registered, {format_size(adding)} more); "
        "raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity in the service unit")
