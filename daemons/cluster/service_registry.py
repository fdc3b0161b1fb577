"""Where daemons on other hosts find a cluster service (the conductor) through the master.

On one host, `mooncake up` lets a worker read the conductor's announce file. Across hosts the
master is the only address every daemon is given (``--master``), so it also keeps a small table
of services. Master operations::

    cluster.register_service {"name", "address", ...}  -> {"ok"}   replaces the record of name
    cluster.lookup_service   {"name"}                  -> the record, or SERVICE_NOT_REGISTERED
    cluster.list_services    {}                        -> [{"record", "last_seen_ago", "alive"}]

A record not refreshed within ``SERVICE_TTL`` is no longer handed out (its daemon died or lost
the master), though `mooncake status --master` still lists it, as silent.

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
from collections.abc import Callable

from daemons.errors import ServiceNotRegistered
from transfer.auth import ClusterSecret
from transfer.errors import InvalidArgument, MooncakeError, TableFull
from transfer.etcd.leader import master_rpc

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 1.0  # seconds; bounds how long a new master leader answers lookups with "not registered"
# Several missed refreshes, so a slow tick or one lost call does not hide a live service.
SERVICE_TTL = 5 * REFRESH_INTERVAL
# Silent this long, a record is forgotten: `status --master` shows a dead service for a while,
# but the names ever registered cannot pile up.
SERVICE_FORGET_AFTER = 60 * SERVICE_TTL
RECORD_LIMIT = 4096  # characters of a record's repr: a record is a name and a few addresses


class ServiceTable:
    """The master's side: service name -> its latest record and when it last came.

    ``clock`` gives the time the table judges silence by; a test passes its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = 16384) -> None:
        self.clock, self.max_entries = clock, max_entries
        self.lock = threading.Lock()
        self.services: dict[str, tuple[dict[str, Any], float]] = {}

    def register(self, server: Any) -> None:
        server.register("cluster.register_service", lambda request: self.put(dict(request.args)))
        server.register("cluster.lookup_service", lambda request: self.lookup(str(request.args.get("name", ""))))
        server.register("cluster.list_services", lambda request: self.listing())

    def put(self, record: dict[str, Any]) -> dict:
        name = record.get("name")
        if not isinstance(name, str) or not name or len(repr(record)) > RECORD_LIMIT:
            raise InvalidArgument(f"a service record needs a name and fits {RECORD_LIMIT} characters")
        now = self.clock()
        with self.lock:
            if name not in self.services and len(self.services) >= self.max_entries:
                self._forget_silent(now)
                if len(self.services) >= self.max_entries:
                    raise TableFull(f"{len(self.services)} services are registered, the most this master "
                                    "holds (metadata_max_entries)")
            self.services[name] = (record, now)
        return {"ok": True}

    def _forget_silent(self, now: float) -> None:
        """Under the lock."""
        for name in [n for n, (_, seen) in self.services.items() if now - seen > SERVICE_FORGET_AFTER]:
            del self.services[name]

    def lookup(self, name: str) -> dict:
        with self.lock:
            record, seen = self.services.get(name, (None, 0.0))
        if record is None:
            raise ServiceNotRegistered(f"no {name} registered with the master: start it with --master")
        silent = self.clock() - seen
        if silent > SERVICE_TTL:
            raise ServiceNotRegistered(f"the {name} at {record.get('address')} went silent {silent:.1f}s ago "
                                       f"(no refresh within {SERVICE_TTL:g}s): is it still running?")
        return record

    def listing(self) -> list[dict]:
        now = self.clock()
        with self.lock:
            self._forget_silent(now)
            entries = list(self.services.values())
        return [{"record": record, "last_seen_ago": now - seen, "alive": now - seen <= SERVICE_TTL}
                for record, seen in entries]


def lookup_service(master: str, name: str, timeout: float, secret: ClusterSecret | None = None) -> dict:
    """The record ``name`` registered with the master ``master`` (an address or etcd://...)."""
    with master_rpc(master, timeout, secret=secret) as client:
        return client.call("cluster.lookup_service", {"name": name})


class ServiceRegistration:
    """A daemon's record kept registered with the master, through leader changes and restarts."""

    def __init__(self, master: str, record: dict, timeout: float, secret: ClusterSecret | None = None) -> None:
        self.record = record
        self.client = master_rpc(master, timeout, secret=secret)
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
