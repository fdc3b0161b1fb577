"""Helpers for store tests against real daemons: a small cluster, library clients, value rules."""

from __future__ import annotations

import hashlib
import time

from daemons.cluster.store_access import connect
from daemons.cluster.workdir import ClusterPaths
from transfer.settings import resolve

# Small segments and fast liveness, so faults resolve in about a second.
FAST = {"MOONCAKE_SEGMENT_SIZE": "8MiB", "MOONCAKE_CLIENT_TTL": "1s", "MOONCAKE_PING_INTERVAL": "100ms",
        "MOONCAKE_STOP_GRACE": "3s"}


def value_for(key: str, size: int) -> bytes:
    """Bytes fully determined by the key, so any reader can tell a wrong byte from a right one."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def config_for(workdir, **flags):
    return resolve({"workdir": str(workdir), **flags}, environ={})


def client_for(workdir, **flags):
    return connect(config_for(workdir, **flags))


def paths_of(workdir) -> ClusterPaths:
    return ClusterPaths.of(workdir)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)
