"""The master's side of high availability: campaign on etcd, serve only while leading.

With ``ha_backend = etcd`` the master registers its store and metadata ops behind a
:class:`daemons.ha.election.LeaderGate`: as a standby (or a leader whose lease lapsed) it
answers them NOT_LEADER, which sends clients back to etcd to find the leader. Losing the lease
also throws the master's state away (see :mod:`daemons.ha.election` for why).

The op log (:mod:`daemons.ha.oplog_writer`): the leader writes its store changes to etcd, and PutEnd
(and a put reservation's commit, which publishes objects as PutEnd does) answers only once its
change is there; a new leader rebuilds the objects from the log before it
serves, so an object acknowledged just before the old leader died is not lost even if its
segment's owner had not heard of it yet.
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

from daemons.cluster.advertise import advertised
from daemons.ha.election import Election, LeaderGate
from daemons.ha.oplog_writer import OpLogWriter
from store.oplog import OpLogJournal, record_adopted
from transfer.errors import NotLeader
from transfer.etcd.kv import EtcdKV

# Answered only once etcd holds what they changed: a successor must not forget them.
DURABLE_OPS = {"store.put_end", "store.batch_put_end", "store.batch_put_commit", "store.set_tenant_quota"}


class OpLogGate(LeaderGate):
    """A LeaderGate whose PutEnds wait for the op log, and whose remounts log what they adopt."""

    def __init__(self, server: Any, is_leader: Callable[[], bool], not_leader: Callable[[], Exception],
                 writer: OpLogWriter) -> None:
        super().__init__(server, is_leader, not_leader)
        self.writer = writer

    def register(self, op: str, handler: Callable, *, blocking: bool = False) -> None:
        if op in DURABLE_OPS:
            # Off the I/O thread: the wait for etcd must not hold up every other request.
            handler, blocking = self._durable(handler), True
        elif op == "store.remount":
            handler = self._logging_adopted(handler)
        super().register(op, handler, blocking=blocking)

    def _durable(self, handler: Callable) -> Callable:
        def run(request: Any) -> Any:
            generation = self.writer.generation
            result = handler(request)
            self.writer.wait_durable(generation)
            if not self.is_leader():
                raise self.not_leader()  # our successor may not have read it
            return result
        return run

    def _logging_adopted(self, handler: Callable) -> Callable:
        def run(request: Any) -> Any:
            result = handler(request)
            service = self.writer.attached
            with service.lock:
                record_adopted(service.state, result["accepted"])
            return result
        return run


def start_election(daemon: Any, install_state: Callable[[Any], None]) -> Election:
    """Campaign for ``daemon`` (a MasterDaemon); ``install_state(server)`` registers fresh ops."""
    config = daemon.config
    address = advertised(daemon.server.address, config)
    timeout = max(config.ha_lease_ttl / 5, 0.2)
    election: Election | None = None
    writer = OpLogWriter(EtcdKV(config.etcd_endpoints, timeout=timeout), config.cluster_id, address,
                         timeout=config.rpc_timeout)

    def refuse() -> NotLeader:
        # No etcd lookup for a hint here: the handlers run on the RPC I/O thread.
        return NotLeader(f"master {address} does not lead cluster {config.cluster_id!r}")

    def fresh_state() -> None:
        install_state(gate)
        daemon.store.state.journal = OpLogJournal()
        writer.attach(daemon.store)

    def take_over() -> None:
        fresh_state()  # whatever this master held before is older than the log
        writer.replay_into(daemon.store, time.monotonic())

    gate = OpLogGate(daemon.server, lambda: election is not None and election.leading, refuse, writer)
    fresh_state()
    election = Election(EtcdKV(config.etcd_endpoints, timeout=timeout), config.cluster_id, address,
                        config.ha_lease_ttl, on_deposed=fresh_state, on_elected=take_over)
    daemon.oplog = writer
    return election.start()
