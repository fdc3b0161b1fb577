"""Master election on etcd: one leader per cluster, standbys ready to take over.

The leader holds ``mooncake-store/<cluster_id>/master_view`` (value: its advertised address)
under a lease of ``ha_lease_ttl``, created by a put-if-absent transaction so two masters can
never both win, and refreshes the lease three times per TTL. A standby polls the key five times
per TTL and campaigns as soon as it is gone, i.e. at most one TTL (plus a poll) after the
leader went silent.

Leadership is judged locally and conservatively: the lease is counted from the moment *before*
the refresh that renewed it was sent, so by the time etcd can let the key lapse this master
already answers NOT_LEADER. A master that loses its lease never serves writes on the state it
had; it drops that state and campaigns again as an empty standby. A newly elected master runs
``on_elected`` (the op-log replay, :mod:`daemons.ha.oplog_writer`) before it serves anything; if that
fails it gives the key up again rather than serve a state it could not rebuild.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any
from collections.abc import Callable

from transfer.etcd.kv import EtcdKV, EtcdUnavailable
from transfer.etcd.leader import master_view_key

log = logging.getLogger(__name__)


class Election:
    def __init__(self, kv: EtcdKV, cluster_id: str, address: str, ttl: float,
                 on_deposed: Callable[[], None], on_elected: Callable[[], None] = lambda: None) -> None:
        self.kv, self.key, self.address = kv, master_view_key(cluster_id), address
        self.ttl = max(1, math.ceil(ttl))  # etcd leases are whole seconds
        self.on_deposed, self.on_elected = on_deposed, on_elected
        self._lease: Any = None
        self._valid_until = 0.0  # monotonic time our lease surely still holds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ha-election", daemon=True)
        self.num_elected = 0

    @property
    def leading(self) -> bool:
        return self._lease is not None and time.monotonic() < self._valid_until

    def start(self) -> Election:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop campaigning; a leader gives the key up at once so a standby need not wait a TTL."""
        self._stop.set()
        self._thread.join(timeout=self.ttl)
        if self._lease is not None:
            try:
                self.kv.revoke(self._lease)
            except EtcdUnavailable:
                pass  # the lease lapses by itself

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._lease is None:
                self._campaign()
                self._stop.wait(self.ttl / 5)
            else:
                self._keep()
                self._stop.wait(self.ttl / 3)

    def _campaign(self) -> None:
        try:
            if self.kv.get(self.key) is not None:
                return
            sent = time.monotonic()
            lease = self.kv.grant(self.ttl)
            if not self.kv.create(self.key, self.address, lease):
                self.kv.revoke(lease)  # another master won the race
                return
        except EtcdUnavailable as exc:
            log.warning("campaign for %s failed: %s", self.key, exc.message)
            return
        try:
            self.on_elected()
        except EtcdUnavailable as exc:
            log.warning("elected but could not take over, standing down: %s", exc.message)
            try:
                self.kv.revoke(lease)
            except EtcdUnavailable:
                pass  # the lease lapses by itself
            return
        self._lease, self._valid_until = lease, sent + self.ttl
        self.num_elected += 1
        log.info("elected leader of %s as %s", self.key, self.address)
        if time.monotonic() >= self._valid_until:
            self._keep()  # the takeover outlasted our own count of the lease: renew (or stand down) now

    def _keep(self) -> None:
        sent = time.monotonic()
        try:
            remaining = self.kv.refresh(self._lease)
        except EtcdUnavailable as exc:
            log.warning("lease refresh failed: %s", exc.message)
            remaining = 0 if time.monotonic() >= self._valid_until else None
        if remaining is None:
            return  # keep serving: the lease still holds until _valid_until
        if remaining > 0:
            self._valid_until = sent + remaining
            return
        log.warning("lost the lease on %s: serving no more writes", self.key)
        self._lease, self._valid_until = None, 0.0
        self.on_deposed()


class LeaderGate:
    """Stands in for the RPC server when store and metadata ops register: each op answers only
    while this master leads, and is looked up at call time, so a fresh state can replace the
    handlers after a re-election without touching the server."""

    def __init__(self, server: Any, is_leader: Callable[[], bool], not_leader: Callable[[], Exception]) -> None:
        self.server, self.is_leader, self.not_leader = server, is_leader, not_leader
        self._handlers: dict[str, Callable] = {}

    def register(self, op: str, handler: Callable, *, blocking: bool = False) -> None:
        if op not in self._handlers:
            self.server.register(op, self._gated(op), blocking=blocking)
        self._handlers[op] = handler

    def _gated(self, op: str) -> Callable:
        def run(request: Any) -> Any:
            if not self.is_leader():
                raise self.not_leader()
            return self._handlers[op](request)
        return run
