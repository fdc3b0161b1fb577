"""Where the daemons of a workdir answer, read from its cluster.json (read-only).

Commands that talk to a running cluster (`put`, `get`, `generate`, the benches) find the daemon
of a role here; nothing in this module starts, stops or writes anything (that is
:mod:`daemons.launcher` and :mod:`daemons.supervisor`).
"""

from __future__ import annotations

import socket
from typing import Any

from daemons.cluster.workdir import ClusterPaths, read_json
from daemons.errors import ClusterNotRunning


def cluster_info(paths: ClusterPaths) -> dict[str, Any]:
    """cluster.json, for commands that need daemon addresses."""
    info = read_json(paths.cluster_file)
    if info is None:
        raise ClusterNotRunning(f"no cluster in {paths.workdir}: start one with `mooncake up`")
    return info


def daemon_address(paths: ClusterPaths, role: str) -> str:
    return _daemon_record(paths, role)["address"]


def local_daemon_address(paths: ClusterPaths, role: str) -> str:
    """The daemon's unix:// endpoint when it has one on this host (a round trip over it costs
    a fraction of one through ZeroMQ over TCP loopback), else its TCP address."""
    daemon = _daemon_record(paths, role)
    if daemon.get("ipc_address") and daemon.get("hostname") == socket.gethostname():
        return daemon["ipc_address"]
    return daemon["address"]


def _daemon_record(paths: ClusterPaths, role: str) -> dict[str, Any]:
    for daemon in cluster_info(paths)["daemons"]:
        if daemon.get("role") == role:
            return daemon
    raise ClusterNotRunning(f"the cluster in {paths.workdir} has no {role}")
