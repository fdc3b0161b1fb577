"""Why each NIC stands where it does, and the NUMA node -> PCIe switch -> device tree of
``mooncake topo show``, as plain data the CLI only has to draw (or print as JSON)."""

from __future__ import annotations

from typing import Any

from topology.matrix import Matrix, natural_key
from topology.model import NicVerdict, Placement, Topology, TopologyReport
from topology.pcie import pcie_group


def explain_file(matrix: Matrix, discovered: tuple[NicVerdict, ...], source: str) -> tuple[NicVerdict, ...]:
    """Verdicts for a matrix loaded from ``source``. Where the file agrees with discovery the
    discovered reason still holds; where it does not, the file is the reason, and what discovery
    would have done is shown beside it so an outdated file stands out."""
    verdicts = []
    for verdict in discovered:
        own = {p.location: p for p in verdict.placements}
        placements = []
        for location, (preferred, secondary) in matrix.items():
            rank = "preferred" if verdict.name in preferred else "secondary" if verdict.name in secondary else None
            if rank is None:
                continue
            found = own.get(location)
            if found is not None and found.rank == rank:
                placements.append(found)
                continue
            if found is not None:
                reason = f"set by {source}; discovery: {found.rank} ({found.reason})"
            elif verdict.skipped is not None:
                reason = f"set by {source}; discovery: skipped ({verdict.skipped})"
            else:
                reason = f"set by {source}"
            placements.append(Placement(location, rank, reason))
        skipped = None if placements else verdict.skipped or f"not listed in {source}"
        verdicts.append(NicVerdict(verdict.name, verdict.kind, skipped, tuple(placements)))
    return tuple(verdicts)


def device_names(topology: Topology) -> set[str]:
    """Every NIC name a matrix file may use on this host."""
    return {d.name for d in topology.rdma_devices} | {i.name for i in topology.interfaces}


def placement_tree(report: TopologyReport) -> list[dict[str, Any]]:
    """NUMA nodes, each with its PCIe groups, each with its NICs and GPUs (JSON-ready).
    Devices whose node is unknown on a multi-node host gather under node None."""
    topology = report.topology
    why = {v.name: v.describe() for v in report.verdicts}
    devices = []  # (numa node, pci path, order, entry)
    for device in topology.rdma_devices:
        ports = ", ".join(f"port {p.number} {p.state} {p.link_layer}" for p in device.ports) or "no ports"
        netdevs = f", netdev {', '.join(device.netdevs)}" if device.netdevs else ""
        devices.append((device.numa_node, device.pci_path, 0,
                        _entry("nic", device.name, device.pci_address, f"RDMA, {ports}{netdevs}", why)))
    for iface in topology.interfaces:
        facts = [iface.driver or ("loopback" if iface.is_loopback else "virtual" if iface.is_virtual else "no driver"),
                 iface.operstate]
        if iface.speed_mbps:
            facts.append(f"{iface.speed_mbps} Mb/s")
        devices.append((iface.numa_node, iface.pci_path, 1,
                        _entry("nic", iface.name, iface.pci_address, "TCP, " + ", ".join(facts), why)))
    for gpu in topology.gpus:
        devices.append((gpu.numa_node, gpu.pci_path, 2,
                        _entry("gpu", gpu.location, gpu.pci_address, gpu.name, {})))

    nodes: dict[int | None, dict[str, Any]] = {
        node.id: {"numa_node": node.id, "cpus": node.cpus, "memory_kb": node.memory_kb, "groups": []}
        for node in topology.numa_nodes
    }
    groups: dict[tuple, dict[str, Any]] = {}
    for numa_node, pci_path, _order, entry in sorted(
            devices, key=lambda d: (d[1][-1:], d[2], natural_key(d[3]["name"]))):
        node_id = topology.numa_of(numa_node)
        node = nodes.setdefault(node_id, {"numa_node": node_id, "cpus": "", "memory_kb": None, "groups": []})
        kind, name = pcie_group(pci_path)
        group = groups.get((node_id, kind, name))
        if group is None:
            group = groups[(node_id, kind, name)] = {"kind": kind, "name": name, "devices": []}
            node["groups"].append(group)
        group["devices"].append(entry)
    for node in nodes.values():
        node["groups"].sort(key=lambda g: (g["kind"] == "virtual", g["name"]))
    return sorted(nodes.values(), key=lambda n: (n["numa_node"] is None, n["numa_node"] or 0))


def _entry(kind: str, name: str, pci_address: str | None, detail: str, why: dict[str, list[str]]) -> dict[str, Any]:
    return {"type": kind, "name": name, "pci_address": pci_address, "detail": detail, "why": why.get(name, [])}


def summarize(matrix: Matrix, report: TopologyReport) -> dict[str, Any]:
    """What `topo discover` reports about the matrix it wrote (JSON-ready)."""
    topology = report.topology
    return {
        "source": report.source,
        "matrix": matrix,
        "numa_nodes": [node.id for node in topology.numa_nodes],
        "gpus": [{"location": g.location, "name": g.name, "pci_address": g.pci_address} for g in topology.gpus],
        "listed": [v.name for v in report.verdicts if v.skipped is None],
        "skipped": {v.name: v.skipped for v in report.verdicts if v.skipped is not None},
        "warnings": list(report.warnings),
    }
