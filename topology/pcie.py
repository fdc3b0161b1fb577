"""PCIe geometry from PCI paths (see ``model.py``): distance, and the switch a device hangs off."""

from __future__ import annotations


def pcie_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int | None:
    """How many components of two PCI paths differ: the hops from each device up to the bridge
    they share. Two functions behind one switch are 4 apart (device and downstream port on each
    side); devices on different host bridges count every component. None when either path is
    unknown, so a virtual interface is never mistaken for a near one."""
    if not a or not b:
        return None
    common = 0
    for left, right in zip(a, b):
        if left != right:
            break
        common += 1
    return (len(a) - common) + (len(b) - common)


def pcie_group(path: tuple[str, ...]) -> tuple[str, str]:
    """The (kind, name) of the PCIe element a device is grouped under in ``topo show``.

    Paths run host bridge, root port, then (behind a switch) the switch's upstream port, its
    downstream port and the device. The upstream port names the switch; a device with no switch
    in between hangs off its root port, and a device directly on the host bridge (an onboard NIC,
    a virtio device) off the bridge itself.
    """
    if not path:
        return ("virtual", "no PCI device")
    if len(path) > 3:
        return ("PCIe switch", path[2])
    if len(path) == 3:
        return ("root port", path[1])
    return ("host bridge", path[0])
