"""NUMA nodes from ``devices/system/node``: each node's CPUs and memory."""

from __future__ import annotations

import re

from topology.model import NumaNode
from topology.sysfs import Sysfs

_NODE = re.compile(r"^node(\d+)$")
_MEM_TOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")


def discover_numa(fs: Sysfs) -> tuple[NumaNode, ...]:
    """Every NUMA node; a host without NUMA information (a VM, a kernel without CONFIG_NUMA)
    counts as the single node 0 holding all online CPUs."""
    base = fs.path("devices/system/node")
    nodes = []
    for entry in fs.entries(base):
        match = _NODE.match(entry)
        if not match:
            continue
        meminfo = fs.text(base / entry / "meminfo") or ""
        memory = _MEM_TOTAL.search(meminfo)
        nodes.append(NumaNode(
            id=int(match.group(1)),
            cpus=fs.text(base / entry / "cpulist", required=True) or "",
            memory_kb=int(memory.group(1)) if memory else None,
        ))
    if not nodes:
        return (NumaNode(0, cpus=fs.text(fs.path("devices/system/cpu/online")) or ""),)
    return tuple(sorted(nodes, key=lambda node: node.id))
