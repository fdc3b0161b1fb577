"""RDMA devices from ``class/infiniband``: ports, their state and link layer, GIDs, netdevs."""

from __future__ import annotations

from topology.model import RdmaDevice, RdmaPort
from topology.sysfs import Sysfs, pci_path_of

_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def discover_rdma(fs: Sysfs) -> tuple[RdmaDevice, ...]:
    # No class/infiniband simply means no RDMA stack: the common case, not worth a warning.
    base = fs.path("class/infiniband")
    return tuple(_device(fs, name) for name in fs.entries(base))


def _device(fs: Sysfs, name: str) -> RdmaDevice:
    path = fs.path("class/infiniband") / name
    pci_path = pci_path_of(fs.resolved_parts(path))
    ports = tuple(
        _port(fs, path / "ports" / entry, int(entry))
        for entry in sorted(fs.entries(path / "ports", required=True), key=_as_int)
        if entry.isdigit()
    )
    return RdmaDevice(
        name=name,
        ports=ports,
        # The netdevs on the same PCI function: RoCE's Ethernet interface, or IPoIB's ib0.
        netdevs=tuple(fs.entries(path / "device" / "net")),
        pci_path=pci_path,
        numa_node=fs.pci_numa_node(pci_path),
    )


def _port(fs: Sysfs, path, number: int) -> RdmaPort:
    state = fs.text(path / "state", required=True) or "UNKNOWN"  # e.g. "4: ACTIVE"
    gids = (fs.text(path / "gids" / entry) for entry in sorted(fs.entries(path / "gids"), key=_as_int))
    return RdmaPort(
        number=number,
        state=state.split(":")[-1].strip(),
        link_layer=fs.text(path / "link_layer") or "unknown",
        gids=tuple(gid for gid in gids if gid and gid != _ZERO_GID),
    )


def _as_int(entry: str) -> int:
    return int(entry) if entry.isdigit() else -1
