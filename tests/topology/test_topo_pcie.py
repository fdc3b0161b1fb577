"""PCI paths, PCIe distance and the switch a device is grouped under."""

import pytest

from topology.pcie import pcie_distance, pcie_group
from topology.sysfs import pci_path_of

ROOT = ("pci0000:00",)
GPU = ROOT + ("0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:04:00.0")
NIC_SAME_SWITCH = ROOT + ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
NIC_OTHER_SWITCH = ROOT + ("0000:00:02.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")
NIC_OTHER_SOCKET = ("pci0000:80", "0000:80:01.0", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0")


@pytest.mark.parametrize("other, distance", [
    (GPU, 0), (NIC_SAME_SWITCH, 4), (NIC_OTHER_SWITCH, 8), (NIC_OTHER_SOCKET, 10),
    (ROOT + ("0000:00:1f.6",), 5), ((), None),
])
def test_distance_counts_the_components_that_differ(other, distance):
    assert pcie_distance(GPU, other) == distance
    assert pcie_distance(other, GPU) == distance


@pytest.mark.parametrize("path, group", [
    (GPU, ("PCIe switch", "0000:01:00.0")),
    (ROOT + ("0000:00:01.0", "0000:01:00.0"), ("root port", "0000:00:01.0")),
    (ROOT + ("0000:00:1f.6",), ("host bridge", "pci0000:00")),
    ((), ("virtual", "no PCI device")),
])
def test_group_is_the_switch_upstream_port_else_root_port_else_bridge(path, group):
    assert pcie_group(path) == group


def test_pci_path_stops_at_the_last_pci_address():
    parts = ("devices", "pci0000:00", "0000:00:03.0", "virtio2", "net", "eth0")
    assert pci_path_of(parts) == ("pci0000:00", "0000:00:03.0")
    assert pci_path_of(("devices", "virtual", "net", "lo")) == ()
    assert pci_path_of(("devices", "pci0000:00")) == ()  # a bridge alone is no device
