"""The master daemon: the cluster's metadata authority.

It serves the transfer engine's segment-descriptor metadata service (``te.meta.*``), so every
engine of the cluster finds its peers' buffers through it; the store's object metadata
(segments, replicas, leases, eviction) joins it with the store.
"""

from __future__ import annotations

from typing import Any

from daemons.base import Daemon
from transfer.metadata_table import MetadataTable, serve_metadata


class MasterDaemon(Daemon):
    role = "master"

    def setup(self) -> None:
        self.segment_descriptors = MetadataTable()
        serve_metadata(self.server, self.segment_descriptors)

    def describe(self) -> dict[str, Any]:
        return {"num_segment_descriptors": len(self.segment_descriptors.names())}
