"""The paper's Figure 4b: two sockets, four PCIe switches, each with one mlx5 NIC and two GPUs."""

from topo_helpers import fixture, reasons

from topology import load_or_discover, placement_tree

FIGURE_4B = {
    "cpu:0": [["mlx5_0", "mlx5_1"], ["mlx5_2", "mlx5_3"]],
    "cpu:1": [["mlx5_2", "mlx5_3"], ["mlx5_0", "mlx5_1"]],
    # Secondary NICs nearest first: the other switch on the same socket, then the other socket.
    "cuda:0": [["mlx5_0"], ["mlx5_1", "mlx5_2", "mlx5_3"]],
    "cuda:1": [["mlx5_0"], ["mlx5_1", "mlx5_2", "mlx5_3"]],
    "cuda:2": [["mlx5_1"], ["mlx5_0", "mlx5_2", "mlx5_3"]],
    "cuda:3": [["mlx5_1"], ["mlx5_0", "mlx5_2", "mlx5_3"]],
    "cuda:4": [["mlx5_2"], ["mlx5_3", "mlx5_0", "mlx5_1"]],
    "cuda:5": [["mlx5_2"], ["mlx5_3", "mlx5_0", "mlx5_1"]],
    "cuda:6": [["mlx5_3"], ["mlx5_2", "mlx5_0", "mlx5_1"]],
    "cuda:7": [["mlx5_3"], ["mlx5_2", "mlx5_0", "mlx5_1"]],
}


def test_matrix_prefers_the_nic_behind_each_gpus_switch():
    matrix, report = load_or_discover(None, fixture("two_socket_8gpu"))

    assert matrix == FIGURE_4B
    assert list(matrix) == list(FIGURE_4B)  # CPU nodes first, then GPUs by index
    assert report.warnings == ()


def test_reasons_for_every_nic():
    _, report = load_or_discover(None, fixture("two_socket_8gpu"))
    why = reasons(report)

    assert why["mlx5_0"] == [
        "preferred for cpu:0: on NUMA node 0",
        "secondary for cpu:1: on NUMA node 0, not 1",
        "preferred for cuda:0: nearest on PCIe (distance 4), on the GPU's NUMA node 0",
        "preferred for cuda:1: nearest on PCIe (distance 4), on the GPU's NUMA node 0",
        "secondary for cuda:2: PCIe distance 8, the nearest is 4",
        "secondary for cuda:3: PCIe distance 8, the nearest is 4",
        "secondary for cuda:4: on NUMA node 0, the GPU is on 1",
        "secondary for cuda:5: on NUMA node 0, the GPU is on 1",
        "secondary for cuda:6: on NUMA node 0, the GPU is on 1",
        "secondary for cuda:7: on NUMA node 0, the GPU is on 1",
    ]
    assert why["mlx5_3"] == [
        "secondary for cpu:0: on NUMA node 1, not 0",
        "preferred for cpu:1: on NUMA node 1",
        "secondary for cuda:0: on NUMA node 1, the GPU is on 0",
        "secondary for cuda:1: on NUMA node 1, the GPU is on 0",
        "secondary for cuda:2: on NUMA node 1, the GPU is on 0",
        "secondary for cuda:3: on NUMA node 1, the GPU is on 0",
        "secondary for cuda:4: PCIe distance 8, the nearest is 4",
        "secondary for cuda:5: PCIe distance 8, the nearest is 4",
        "preferred for cuda:6: nearest on PCIe (distance 4), on the GPU's NUMA node 1",
        "preferred for cuda:7: nearest on PCIe (distance 4), on the GPU's NUMA node 1",
    ]
    skipped = {name: lines for name, lines in why.items() if not name.startswith("mlx5_")}
    assert skipped == {
        "docker0": ["skipped: TCP interface; the RDMA devices are listed instead"],
        "eno1": ["skipped: TCP interface; the RDMA devices are listed instead"],
        "enp3s0np0": ["skipped: netdev of RDMA device mlx5_0, which is listed instead"],
        "enp8s0np0": ["skipped: netdev of RDMA device mlx5_1, which is listed instead"],
        "enp131s0np0": ["skipped: netdev of RDMA device mlx5_2, which is listed instead"],
        "enp136s0np0": ["skipped: netdev of RDMA device mlx5_3, which is listed instead"],
        "lo": ["skipped: loopback"],
    }


def test_rdma_devices_gpus_and_numa_nodes_are_discovered_in_full():
    _, report = load_or_discover(None, fixture("two_socket_8gpu"))
    topology = report.topology
    mlx5_2 = topology.rdma_devices[2]
    (port,) = mlx5_2.ports

    assert [(n.id, n.cpus, n.memory_kb) for n in topology.numa_nodes] == [
        (0, "0-23,48-71", 263847536), (1, "24-47,72-95", 264182272)]
    assert (mlx5_2.name, mlx5_2.pci_address, mlx5_2.numa_node, mlx5_2.netdevs) == (
        "mlx5_2", "0000:83:00.0", 1, ("enp131s0np0",))
    assert (port.number, port.state, port.link_layer) == (1, "ACTIVE", "Ethernet")
    assert port.gids == ("fe80:0000:0000:0000:0e42:a1ff:fe00:0002",
                         "0000:0000:0000:0000:0000:ffff:0a00:0003")  # the all-zero GID is dropped
    assert [(g.location, g.pci_address, g.numa_node) for g in topology.gpus][::2] == [
        ("cuda:0", "0000:04:00.0", 0), ("cuda:2", "0000:09:00.0", 0),
        ("cuda:4", "0000:84:00.0", 1), ("cuda:6", "0000:89:00.0", 1)]
    assert topology.gpus[0].name == "NVIDIA GPU [10de:2330]"  # no runtime asked for a fixture


def test_tree_groups_devices_by_numa_node_and_pcie_switch():
    _, report = load_or_discover(None, fixture("two_socket_8gpu"))
    tree = placement_tree(report)

    shape = {node["numa_node"]: {f"{g['kind']} {g['name']}": [d["name"] for d in g["devices"]]
                                 for g in node["groups"]} for node in tree}
    assert shape == {
        0: {"PCIe switch 0000:01:00.0": ["mlx5_0", "enp3s0np0", "cuda:0", "cuda:1"],
            "PCIe switch 0000:06:00.0": ["mlx5_1", "enp8s0np0", "cuda:2", "cuda:3"],
            "host bridge pci0000:00": ["eno1"]},
        1: {"PCIe switch 0000:81:00.0": ["mlx5_2", "enp131s0np0", "cuda:4", "cuda:5"],
            "PCIe switch 0000:86:00.0": ["mlx5_3", "enp136s0np0", "cuda:6", "cuda:7"]},
        # On a two-node host an interface without a PCI device has no known node.
        None: {"virtual no PCI device": ["docker0", "lo"]},
    }
    mlx5_0 = tree[0]["groups"][0]["devices"][0]
    assert mlx5_0["detail"] == "RDMA, port 1 ACTIVE Ethernet, netdev enp3s0np0"
    assert mlx5_0["why"] == reasons(report)["mlx5_0"]
