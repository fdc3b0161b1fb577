"""Which daemon class serves each role, and which daemons `mooncake up` starts, in order.

A role joins the plan only once it does real work (each gains its function in its own issue).
"""

from __future__ import annotations

from dataclasses import dataclass

from daemons.base import Daemon
from daemons.master import MasterDaemon

DAEMON_CLASSES: dict[str, type[Daemon]] = {
    MasterDaemon.role: MasterDaemon,
}


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    role: str


def cluster_plan() -> list[DaemonSpec]:
    """The daemons of a single-host cluster, in start order (later ones may need earlier ones)."""
    return [DaemonSpec("master", "master")]
