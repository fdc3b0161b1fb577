"""This VM: no NUMA directory, one virtio NIC, lo and two ifb interfaces."""

from topo_helpers import fixture, reasons

from topology import load_or_discover, placement_tree


def test_vm_counts_as_one_node_and_lists_its_virtio_nic():
    matrix, report = load_or_discover(None, fixture("vm"))

    assert matrix == {"cpu:0": [["eth0"], []]}
    assert reasons(report) == {
        "eth0": ["preferred for cpu:0: on NUMA node 0 (the only node)"],
        "ifb0": ["skipped: virtual interface (--include-virtual lists it)"],
        "ifb1": ["skipped: virtual interface (--include-virtual lists it)"],
        "lo": ["skipped: loopback"],
    }
    assert report.warnings == ()
    assert report.source == f"discovered from {fixture('vm')}"


def test_vm_nic_is_found_through_its_virtio_device():
    _, report = load_or_discover(None, fixture("vm"))
    (node,) = report.topology.numa_nodes
    eth0 = next(i for i in report.topology.interfaces if i.name == "eth0")

    assert (node.id, node.cpus) == (0, "0-1")  # from devices/system/cpu/online
    assert eth0.pci_path == ("pci0000:00", "0000:00:03.0")
    assert (eth0.driver, eth0.numa_node, eth0.speed_mbps, eth0.is_virtual) == ("virtio_net", None, None, False)


def test_include_virtual_still_skips_interfaces_that_are_down():
    matrix, report = load_or_discover(None, fixture("vm"), include_virtual=True)

    assert matrix == {"cpu:0": [["eth0"], []]}
    assert reasons(report)["ifb0"] == ["skipped: link down"]
    assert reasons(report)["lo"] == ["skipped: loopback"]


def test_vm_tree_puts_virtual_interfaces_apart_from_the_host_bridge():
    _, report = load_or_discover(None, fixture("vm"))
    (node,) = placement_tree(report)

    assert [(g["kind"], g["name"], [d["name"] for d in g["devices"]]) for g in node["groups"]] == [
        ("host bridge", "pci0000:00", ["eth0"]),
        ("virtual", "no PCI device", ["ifb0", "ifb1", "lo"]),
    ]
