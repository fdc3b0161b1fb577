"""Network interfaces from ``class/net``: where they sit on PCIe and whether TCP can use them."""

from __future__ import annotations

from topology.model import NetInterface
from topology.sysfs import Sysfs, pci_path_of

_ARPHRD_LOOPBACK = 772
_IFF_UP = 0x1


def discover_interfaces(fs: Sysfs) -> tuple[NetInterface, ...]:
    base = fs.path("class/net")
    return tuple(_interface(fs, name) for name in fs.entries(base, required=True))


def _interface(fs: Sysfs, name: str) -> NetInterface:
    path = fs.path("class/net") / name
    # The class entry links to the device's place in the tree: devices/virtual/net/<name> for
    # software interfaces, under the PCI function (through virtio2/ in a VM) for real ones.
    parts = fs.resolved_parts(path)
    pci_path = pci_path_of(parts)
    operstate = fs.text(path / "operstate", required=True) or "unknown"
    flags = fs.number(path / "flags", base=16) or 0
    speed = fs.number(path / "speed")  # EINVAL while the link is down: unknown, not a problem
    return NetInterface(
        name=name,
        operstate=operstate,
        is_loopback=fs.number(path / "type") == _ARPHRD_LOOPBACK,
        is_virtual=not parts or parts[:2] == ("devices", "virtual"),
        # "unknown" is what drivers without carrier reporting (dummy, tun) say while working.
        is_up=operstate == "up" or (operstate == "unknown" and bool(flags & _IFF_UP)),
        driver=fs.link_name(path / "device" / "driver"),
        speed_mbps=speed if speed is not None and speed > 0 else None,
        pci_path=pci_path,
        numa_node=fs.pci_numa_node(pci_path),
    )
