"""`mooncake status --master`: a cluster as its master knows it, when its daemons run on other hosts.

The local status reads the workdir's pidfiles; across hosts the master's address is all the caller
has, so every row comes from what the master keeps: itself (its ``status``), the store clients
it has met with their segments (``store.inspect``), and the services registered with it
(:mod:`daemons.cluster.service_registry`). A row is alive when the master heard from it recently enough
to rely on it: a store client while registered (the master drops one silent past its
``client_ttl``), a service within ``SERVICE_TTL``.

The answer is one plain dict (the ``--json`` schema)::

    {"master": {"spec", "address", "name", "pid", "uptime_s", "leading"},
     "daemons": [{"name", "role", "address", "alive", "last_seen_ago", "segments": [
                     {"segment_id", "endpoint", "capacity_bytes", "used_bytes"}]}],
     "healthy", "checked_at"}

``address`` of the master is the one that answered: for ``etcd://...``, the elected leader.
``leading`` is that master's own word on its election, null without one.
"""

from __future__ import annotations

import time
from typing import Any

from transfer.auth import ClusterSecret
from store.master_client import MasterClient


def _segment(row: dict) -> dict:
    return {key: row[key] for key in ("segment_id", "endpoint", "capacity_bytes", "used_bytes")}


def client_rows(clients: list[dict], segments: list[dict]) -> list[dict]:
    by_id = {s["segment_id"]: _segment(s) for s in segments}
    rows = []
    for client in clients:
        owned = [by_id[s] for s in client["segments"] if s in by_id]
        # A store client's segments are reached at its transfer endpoint: the address that says
        # where it runs.
        address = next((s["endpoint"] for s in owned if s["endpoint"]), None)
        rows.append({"name": client["client_id"], "role": "store-client", "address": address,
                     "alive": client["registered"], "last_seen_ago": client["last_seen_ago"],
                     "segments": owned})
    return rows


def service_rows(services: list[dict]) -> list[dict]:
    return [{"name": s["record"]["name"], "role": s["record"]["name"], "address": s["record"].get("address"),
             "alive": s["alive"], "last_seen_ago": s["last_seen_ago"], "segments": []} for s in services]


def remote_status(master: str, timeout: float, secret: ClusterSecret | None = None) -> dict[str, Any]:
    """The cluster the master ``master`` (an address or etcd://...) knows; raises the RPC error
    (RPC_TIMEOUT, NOT_LEADER) when no master answers within ``timeout``."""
    client = MasterClient(master, "status", timeout, secret=secret)
    try:
        own = client.rpc.call("status")
        clients = client.inspect("clients")
        segments = client.inspect("segments")
        services = client.rpc.call("cluster.list_services")
        address = client.rpc.address
    finally:
        client.close()
    head = {"name": own["name"], "role": "master", "address": address, "alive": True, "last_seen_ago": 0.0,
            "segments": []}
    daemons = [head, *client_rows(clients, segments), *service_rows(services)]
    return {"master": {"spec": master, "address": address, "name": own["name"], "pid": own["pid"],
                       "uptime_s": own["uptime_s"], "leading": own.get("ha", {}).get("leading")},
            "daemons": daemons, "healthy": all(d["alive"] for d in daemons), "checked_at": time.time()}
