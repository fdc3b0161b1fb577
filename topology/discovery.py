"""Discovery of one host's topology from a sysfs tree.

``discover`` never raises: whatever cannot be read becomes a warning on the result, because a
host whose sysfs is odd must still be able to move bytes over TCP.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from topology.gpu import discover_gpus
from topology.gpu_runtime import RuntimeGpus, runtime_gpus
from topology.model import Topology
from topology.net import discover_interfaces
from topology.numa import discover_numa
from topology.rdma import discover_rdma
from topology.sysfs import Sysfs


def discover(sysfs_root: str | os.PathLike = "/sys",
             gpu_runtime: Callable[[], RuntimeGpus] | None = None) -> Topology:
    """The topology under ``sysfs_root``. GPU indices and names come from ``gpu_runtime``,
    which defaults to asking torch/cupy, but only for the live ``/sys``: a fixture tree
    describes some other machine, whose GPUs the local runtime knows nothing about."""
    if gpu_runtime is None and os.path.realpath(sysfs_root) == "/sys":
        gpu_runtime = runtime_gpus
    fs = Sysfs(sysfs_root)
    if not os.path.isdir(sysfs_root):
        fs.warn(f"sysfs root {sysfs_root} is not a directory; assuming one NUMA node and no devices")
    numa_nodes = discover_numa(fs)
    interfaces = discover_interfaces(fs)
    rdma_devices = discover_rdma(fs)
    gpus = discover_gpus(fs, gpu_runtime)
    return Topology(str(sysfs_root), numa_nodes, interfaces, rdma_devices, gpus, tuple(fs.warnings))
