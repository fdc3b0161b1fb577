"""The master daemon: the cluster's metadata authority.

It serves the transfer engine's segment-descriptor metadata service (``te.meta.*``), so every
engine of the cluster finds its peers' buffers through it, and the store's object metadata
(``store.*``: segments, replicas, leases, pins, eviction; see :mod:`store.master_service`), and
the table through which daemons on other hosts find the conductor (``cluster.*``; see
:mod:`daemons.cluster.service_registry`). It never touches object bytes. Its tick evicts above the
watermark and drops silent store clients.
"""

from __future__ import annotations

from typing import Any

from daemons.base import Daemon
from daemons.ha.master_election import start_election
from store.master_service import StoreService
from daemons.cluster.service_registry import ServiceTable
from transfer.metadata.table import MetadataTable, serve_metadata


class MasterDaemon(Daemon):
    role = "master"
    tick_interval = 0.05  # eviction and liveness react within 50 ms (Mooncake polls every 10 ms)

    election = None  # with ha_backend etcd: this master's campaign (daemons.ha.master_election)
    oplog = None  # and its op-log writer

    def setup(self) -> None:
        if self.config.ha_backend == "etcd":
            self.election = start_election(self, self._install_state)
        else:
            self._install_state(self.server)

    def _install_state(self, server: Any) -> None:
        """Fresh, empty metadata and store state, its ops registered on ``server``."""
        self.segment_descriptors = MetadataTable()
        serve_metadata(server, self.segment_descriptors)
        self.store = StoreService(self.config)
        self.store.register(server)
        self.services = ServiceTable()
        self.services.register(server)

    def tick(self, now: float) -> None:
        self.store.tick(now)

    def teardown(self) -> None:
        if self.election is not None:
            self.election.stop()
        if self.oplog is not None:
            self.oplog.stop()

    def describe(self) -> dict[str, Any]:
        ha = {"ha": {"leading": self.election.leading, "address": self.election.address}} if self.election else {}
        return {"num_segment_descriptors": len(self.segment_descriptors.names()),
                **self.store.describe(), **ha}
