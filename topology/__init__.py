"""Topology: discovers NUMA nodes, PCIe placement, NICs and GPUs from sysfs and turns them into
the topology matrix that the transfer engine's path selection reads.

The room sits at the bottom of the import graph: it imports nothing from the other rooms and
takes plain arguments (``sysfs_root``, ``include_virtual``, a matrix file path).
"""

from topology.discovery import discover
from topology.errors import TopologyError
from topology.explain import placement_tree, summarize
from topology.local import load_or_discover
from topology.matrix import Matrix, build_matrix
from topology.matrix_file import load_matrix, parse_matrix, write_matrix
from topology.model import Gpu, NetInterface, NicVerdict, NumaNode, Placement, RdmaDevice, RdmaPort, Topology, TopologyReport

__all__ = [
    "discover", "build_matrix", "load_or_discover", "load_matrix", "parse_matrix", "write_matrix",
    "placement_tree", "summarize", "Matrix", "TopologyError", "Topology", "TopologyReport", "NumaNode",
    "NetInterface", "RdmaDevice", "RdmaPort", "Gpu", "NicVerdict", "Placement",
]
