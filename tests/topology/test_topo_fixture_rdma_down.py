"""A host whose only RDMA port is DOWN: discovery falls back to the TCP interfaces."""

from topo_helpers import fixture, reasons

from topology import load_or_discover


def test_down_rdma_port_falls_back_to_tcp_interfaces():
    matrix, report = load_or_discover(None, fixture("rdma_port_down"))

    assert matrix == {"cpu:0": [["eno1"], []], "cuda:0": [["eno1"], []]}
    assert reasons(report) == {
        "docker0": ["skipped: virtual interface (--include-virtual lists it)"],
        "eno1": ["preferred for cpu:0: on NUMA node 0 (the only node)",
                 "preferred for cuda:0: nearest on PCIe (distance 3)"],
        "eno2": ["skipped: link down"],
        "ib0": ["skipped: link down"],
        "lo": ["skipped: loopback"],
        "mlx5_0": ["skipped: no ACTIVE port (port 1 DOWN)"],
    }


def test_include_virtual_lists_the_bridge_but_never_nearest_to_a_gpu():
    matrix, report = load_or_discover(None, fixture("rdma_port_down"), include_virtual=True)

    assert matrix == {"cpu:0": [["docker0", "eno1"], []], "cuda:0": [["eno1"], ["docker0"]]}
    assert reasons(report)["docker0"] == [
        "preferred for cpu:0: on NUMA node 0 (the only node)",
        "secondary for cuda:0: no PCI path, so no PCIe distance",
    ]


def test_down_port_is_described():
    _, report = load_or_discover(None, fixture("rdma_port_down"))
    (hca,) = report.topology.rdma_devices

    assert [(p.number, p.state, p.link_layer) for p in hca.ports] == [(1, "DOWN", "InfiniBand")]
    assert hca.netdevs == ("ib0",)
    assert hca.active_ports == ()
