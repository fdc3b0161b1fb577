"""Where daemons on other hosts find a cluster service (the conductor) through the master.

On one host, `mooncake up` lets a worker read the conductor's announce file. Across hosts the
master is the only address every daemon is given (``--master``), so it also keeps a small table
of services. Master operations::

    cluster.register_service {"name", "address", ...}  -> {"ok"}   replaces the record of name
    cluster.lookup_service   {"name"}                  -> the record, or SERVICE_NOT_REGISTERED

The table lives in the master's memory and is installed with the rest of its state, so a new HA
leader (or a restarted master) starts with it empty: the registering daemon therefore registers
again every ``REFRESH_INTERVAL`` (:class:`ServiceRegistration`) instead of once, and a lookup
fails only until that next refresh.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from daemons.errors import ServiceNotRegistered
from transfer.errors import MooncakeError
from transfer.leader import master_rpc
from transfer.rpc import Request

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 1.0  # seconds; bounds how long a new master leader answers lookups with "not registered"


class ServiceTable:
    """The master's side: service name -> its latest record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.services: dict[str, dict[str, Any]] = {}

    def register(self, server: Any) -> None:
        server.register("cluster.register_service", self._register)
        server.register("cluster.lookup_service", self._lookup)

    def _register(self, request: Request) -> dict:
        record = dict(request.args)
        with self.lock:
            self.services[record["name"]] = record
        return {"ok": True}

    def _lookup(self, request: Request) -> dict:
        name = request.args["name"]
        with self.lock:
            record = self.services.get(name)
        if record is None:
            raise ServiceNotRegistered(f"no {name} registered with the master: start it with --master")
        return record


def lookup_service(master: str, name: str, timeout: float) -> dict:
    """The record ``name`` registered with the master ``master`` (an address or etcd://...)."""
    with master_rpc(master, timeout) as client:
        return client.call("cluster.lookup_service", {"name": name})


class ServiceRegistration:
    """A daemon's record kept registered with the master, through leader changes and restarts."""

    def __init__(self, master: str, record: dict, timeout: float) -> None:
        self.record = record
        self.client = master_rpc(master, timeout)
        self.next_refresh = 0.0

    def refresh(self, strict: bool) -> None:
        """Register now; with ``strict``, a failure raises (a daemon starting without its master
        should say so), else it is logged and the next refresh tries again."""
        self.next_refresh = time.monotonic() + REFRESH_INTERVAL
        try:
            self.client.call("cluster.register_service", self.record)
        except MooncakeError as exc:
            if strict:
                raise
            log.warning("could not register %s with the master: %s", self.record["name"], exc)

    def tick(self, now: float) -> None:
        if now >= self.next_refresh:
            self.refresh(strict=False)

    def close(self) -> None:
        self.client.close()
