"""The master daemon: the cluster's metadata authority.

It serves the transfer engine's segment-descriptor metadata service (``te.meta.*``), so every
engine of the cluster finds its peers' buffers through it, and the store's object metadata
(``store.*``: segments, replicas, leases, pins, eviction; see :mod:`daemons.master_store`). It
never touches object bytes. Its tick evicts above the watermark and drops silent store clients.
"""

from __future__ import annotations

from typing import Any

from daemons.base import Daemon
from daemons.master_store import StoreService
from transfer.metadata_table import MetadataTable, serve_metadata


class MasterDaemon(Daemon):
    role = "master"
    tick_interval = 0.05  # eviction and liveness react within 50 ms (Mooncake polls every 10 ms)

    def setup(self) -> None:
        self.segment_descriptors = MetadataTable()
        serve_metadata(self.server, self.segment_descriptors)
        self.store = StoreService(self.config)
        self.store.register(self.server)

    def tick(self, now: float) -> None:
        self.store.tick(now)

    def describe(self) -> dict[str, Any]:
        return {"num_segment_descriptors": len(self.segment_descriptors.names()),
                **self.store.describe()}
