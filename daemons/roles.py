"""Which daemon class serves each role, and which daemons `mooncake up` starts, in which waves.

A role joins the plan only once it does real work (each gains its function in its own issue).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from daemons.base import Daemon
from transfer.settings import Config


def _imported_at_start(module: str, name: str) -> Callable[..., Daemon]:
    """A daemon class imported only when the daemon starts: the serving daemons import torch, the
    master and store client the whole store, which every `mooncake` command (`status` imports this
    table through the supervisor) would otherwise pay for."""
    def start(*args: Any) -> Daemon:
        return getattr(importlib.import_module(module), name)(*args)
    return start


def _prefill(name: str, paths: Any, config: Config, *args: Any) -> Daemon:
    """A plain prefill worker, or a CPP group of ``prefill_group_size`` stage processes that
    the conductor sees as one prefill instance."""
    module, cls = (("daemons.workers.cpp.group_worker", "PrefillGroupDaemon") if config.prefill_group_size > 1
                   else ("daemons.workers.prefill", "PrefillWorkerDaemon"))
    return _imported_at_start(module, cls)(name, paths, config, *args)


DAEMON_CLASSES: dict[str, Callable[..., Daemon]] = {
    "master": _imported_at_start("daemons.master", "MasterDaemon"),
    "store-client": _imported_at_start("daemons.store_client", "StoreClientDaemon"),
    "conductor": _imported_at_start("daemons.serving.conductor_daemon", "ConductorDaemon"),
    "prefill": _prefill,
    "decode": _imported_at_start("daemons.workers.decode", "DecodeWorkerDaemon"),
}


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    role: str


def cluster_plan(config: Config) -> list[list[DaemonSpec]]:
    """The daemons of a single-host cluster in start waves: a wave's daemons start together,
    once every daemon of the waves before it answers (a daemon needs only earlier waves)."""
    store_clients = [DaemonSpec(f"store-client-{i}", "store-client") for i in range(config.store_clients)]
    # The conductor before the workers (each registers with it while it starts); none of them
    # when no worker is wanted, e.g. a store-only cluster. Workers need only the master and the
    # conductor: they start together, each importing torch on its own core while one is free.
    workers = [*(DaemonSpec(f"prefill-{i}", "prefill") for i in range(config.prefill_workers)),
               *(DaemonSpec(f"decode-{i}", "decode") for i in range(config.decode_workers))]
    conductor = [DaemonSpec("conductor", "conductor")] if workers else []
    waves = [[DaemonSpec("master", "master")], [*store_clients, *conductor], workers]
    return [wave for wave in waves if wave]
