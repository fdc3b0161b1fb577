"""The topology this host runs with: loaded from a matrix file, or discovered.

This is what ``mooncake up`` / ``start`` and the transfer engine call; it takes plain arguments
(the caller reads the ``topology``, ``sysfs_root`` and ``include_virtual`` settings).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from topology.discovery import discover
from topology.explain import device_names, explain_file
from topology.gpu_runtime import RuntimeGpus
from topology.matrix import Matrix, build_matrix
from topology.matrix_file import load_matrix
from topology.model import TopologyReport


def load_or_discover(topology_file: str | os.PathLike | None,
                     sysfs_root: str | os.PathLike = "/sys",
                     include_virtual: bool = False,
                     gpu_runtime: Callable[[], RuntimeGpus] | None = None) -> tuple[Matrix, TopologyReport]:
    """The matrix to use and a report of how it came about.

    With ``topology_file`` (non-empty) the file wins, but the host is still discovered: every
    name in the file must be a device this host has, and the report explains the file's choices
    against what discovery would have done. Raises :class:`TopologyError` only for a bad file;
    discovery problems are ``report.warnings``.
    """
    topology = discover(sysfs_root, gpu_runtime)
    matrix, verdicts = build_matrix(topology, include_virtual)
    if not topology_file:
        return matrix, TopologyReport(topology, verdicts, f"discovered from {sysfs_root}")
    source = str(topology_file)
    loaded = load_matrix(source, device_names(topology))
    return loaded, TopologyReport(topology, explain_file(loaded, verdicts, source), source)
