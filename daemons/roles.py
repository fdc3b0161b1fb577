"""Which daemon class serves each role, and which daemons `mooncake up` starts, in order.

A role joins the plan only once it does real work (each gains its function in its own issue).
"""

from __future__ import annotations

from dataclasses import dataclass

from daemons.base import Daemon
from daemons.master import MasterDaemon
from daemons.store_client import StoreClientDaemon
from transfer.settings import Config

DAEMON_CLASSES: dict[str, type[Daemon]] = {
    MasterDaemon.role: MasterDaemon,
    StoreClientDaemon.role: StoreClientDaemon,
}


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    role: str


def cluster_plan(config: Config) -> list[DaemonSpec]:
    """The daemons of a single-host cluster, in start order (later ones may need earlier ones)."""
    store_clients = [DaemonSpec(f"store-client-{i}", "store-client") for i in range(config.store_clients)]
    return [DaemonSpec("master", "master"), *store_clients]
