"""The topology matrix: for each location (a NUMA node's CPUs, a GPU), its preferred NICs and the
rest. Pure: it turns a discovered :class:`Topology` into Mooncake's format

    {"cpu:0": [["mlx5_0", "mlx5_1"], ["mlx5_2", "mlx5_3"]], "cuda:0": [["mlx5_0"], [...]], ...}

together with a verdict on every NIC saying why it is preferred, secondary or skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Callable

from topology.model import Gpu, NicVerdict, NumaNode, Placement, Topology
from topology.pcie import pcie_distance

Matrix = dict[str, list[list[str]]]


@dataclass(frozen=True)
class _Nic:
    """A NIC the matrix lists, RDMA device or TCP interface alike."""

    name: str
    kind: str
    pci_path: tuple[str, ...]
    numa_node: int | None


def natural_key(name: str) -> tuple:
    """Sort mlx5_2 before mlx5_10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name) if part)


def build_matrix(topology: Topology, include_virtual: bool = False) -> tuple[Matrix, tuple[NicVerdict, ...]]:
    listed, skipped = _choose_nics(topology, include_virtual)
    placements: dict[str, list[Placement]] = {nic.name: [] for nic in listed}
    matrix: Matrix = {}
    for node in topology.numa_nodes:
        matrix[f"cpu:{node.id}"] = _rank(f"cpu:{node.id}", listed, placements,
                                         lambda nic, n=node: _for_cpu(topology, n, nic))
    for gpu in topology.gpus:
        judge = _gpu_judge(topology, gpu, listed)
        matrix[gpu.location] = _rank(gpu.location, listed, placements, judge)
    kinds = {d.name: "rdma" for d in topology.rdma_devices}
    kinds.update({i.name: "tcp" for i in topology.interfaces})
    verdicts = tuple(
        NicVerdict(name, kinds[name], skipped.get(name), tuple(placements.get(name, ())))
        for name in sorted(kinds, key=natural_key)
    )
    return matrix, verdicts


def _choose_nics(topology: Topology, include_virtual: bool) -> tuple[list[_Nic], dict[str, str]]:
    """RDMA devices with an ACTIVE port when there are any; otherwise the interfaces TCP can use."""
    skipped: dict[str, str] = {}
    rdma = []
    carrier = {}  # netdev -> the listed RDMA device it belongs to
    for device in topology.rdma_devices:
        if device.active_ports:
            rdma.append(_Nic(device.name, "rdma", device.pci_path, device.numa_node))
            carrier.update(dict.fromkeys(device.netdevs, device.name))
        else:
            states = ", ".join(f"port {p.number} {p.state}" for p in device.ports) or "no ports"
            skipped[device.name] = f"no ACTIVE port ({states})"
    tcp = []
    for iface in topology.interfaces:
        if iface.is_loopback:
            skipped[iface.name] = "loopback"
        elif iface.name in carrier:
            skipped[iface.name] = f"netdev of RDMA device {carrier[iface.name]}, which is listed instead"
        elif rdma:
            skipped[iface.name] = "TCP interface; the RDMA devices are listed instead"
        elif iface.is_virtual and not include_virtual:
            skipped[iface.name] = "virtual interface (--include-virtual lists it)"
        elif not iface.is_up:
            skipped[iface.name] = f"link {iface.operstate}"
        else:
            tcp.append(_Nic(iface.name, "tcp", iface.pci_path, iface.numa_node))
    return sorted(rdma or tcp, key=lambda nic: natural_key(nic.name)), skipped


# judge(nic) -> (preferred?, reason, sort key among its list)
Judge = Callable[[_Nic], tuple[bool, str, tuple]]


def _rank(location: str, listed: list[_Nic], placements: dict[str, list[Placement]], judge: Judge) -> list[list[str]]:
    """Split ``listed`` into [preferred, secondary] by ``judge``, noting each NIC's placement."""
    preferred, secondary = [], []
    for nic in listed:
        is_preferred, reason, order = judge(nic)
        rank = "preferred" if is_preferred else "secondary"
        placements[nic.name].append(Placement(location, rank, reason))
        (preferred if is_preferred else secondary).append((order, natural_key(nic.name), nic.name))
    return [[name for *_, name in sorted(preferred)], [name for *_, name in sorted(secondary)]]


def _for_cpu(topology: Topology, node: NumaNode, nic: _Nic) -> tuple[bool, str, tuple]:
    nic_node = topology.numa_of(nic.numa_node)
    if nic_node == node.id:
        only = " (the only node)" if len(topology.numa_nodes) == 1 else ""
        return True, f"on NUMA node {node.id}{only}", ()
    where = "NUMA node unknown" if nic_node is None else f"on NUMA node {nic_node}"
    return False, f"{where}, not {node.id}", ()


def _gpu_judge(topology: Topology, gpu: Gpu, listed: list[_Nic]) -> Judge:
    """NICs at the smallest PCIe distance are preferred, looking only at the GPU's NUMA node
    when NICs are known to be there (so a nearer-looking path through the other socket's root
    complex never wins); all the others are secondary, nearest first."""
    gpu_node = topology.numa_of(gpu.numa_node)
    local = [nic for nic in listed if gpu_node is not None and topology.numa_of(nic.numa_node) == gpu_node]
    restricted = bool(local) and len(topology.numa_nodes) > 1
    candidates = local if restricted else listed
    distance = {nic.name: pcie_distance(nic.pci_path, gpu.pci_path) for nic in listed}
    known = [distance[nic.name] for nic in candidates if distance[nic.name] is not None]
    nearest = min(known) if known else None
    where = f", on the GPU's NUMA node {gpu_node}" if restricted else ""

    def judge(nic: _Nic) -> tuple[bool, str, tuple]:
        d = distance[nic.name]
        order = (d is None, d or 0)
        if restricted and nic not in candidates:
            nic_node = topology.numa_of(nic.numa_node)
            node_text = "NUMA node unknown" if nic_node is None else f"on NUMA node {nic_node}"
            return False, f"{node_text}, the GPU is on {gpu_node}", order
        if nearest is None:
            return True, "no PCIe distance is known, so every candidate is equal", order
        if d == nearest:
            return True, f"nearest on PCIe (distance {d}){where}", order
        if d is None:
            return False, "no PCI path, so no PCIe distance", order
        return False, f"PCIe distance {d}, the nearest is {nearest}", order

    return judge
