"""Which daemon class serves each role, and which daemons `mooncake up` starts, in order.

A role joins the plan only once it does real work (each gains its function in its own issue).
"""

from __future__ import annotations

from dataclasses import dataclass

from daemons.base import Daemon
from daemons.conductor import ConductorDaemon
from daemons.decode_worker import DecodeWorkerDaemon
from daemons.master import MasterDaemon
from daemons.prefill_worker import PrefillWorkerDaemon
from daemons.store_client import StoreClientDaemon
from transfer.settings import Config

DAEMON_CLASSES: dict[str, type[Daemon]] = {
    MasterDaemon.role: MasterDaemon,
    StoreClientDaemon.role: StoreClientDaemon,
    ConductorDaemon.role: ConductorDaemon,
    PrefillWorkerDaemon.role: PrefillWorkerDaemon,
    DecodeWorkerDaemon.role: DecodeWorkerDaemon,
}


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    role: str


def cluster_plan(config: Config) -> list[DaemonSpec]:
    """The daemons of a single-host cluster, in start order (later ones may need earlier ones)."""
    store_clients = [DaemonSpec(f"store-client-{i}", "store-client") for i in range(config.store_clients)]
    # The conductor before the workers: each worker registers with it while it starts.
    serving = [DaemonSpec("conductor", "conductor"),
               *(DaemonSpec(f"prefill-{i}", "prefill") for i in range(config.prefill_workers)),
               *(DaemonSpec(f"decode-{i}", "decode") for i in range(config.decode_workers))]
    return [DaemonSpec("master", "master"), *store_clients, *serving]
