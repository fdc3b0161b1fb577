"""The store-client daemon: contributes a segment of ``segment_size`` to the pool and keeps it.

A thin loop around :class:`store.client.StoreClient`: at start it loads the host's topology
matrix (the one `mooncake up` wrote, else discovered now) for its transfer engine, puts its
segment in a shared-memory region named with the cluster's prefix, and mounts it. Its tick pings
the master every ``ping_interval`` (re-mounting and re-reporting its objects when told
NEED_REMOUNT); SIGTERM unmounts the segment (its objects leave the pool) and frees the memory.
Its metrics (:mod:`daemons.observe.store_metrics`): the segment's capacity and use, its client's
own puts and gets, remounts, and pings the master did not answer.

After `mooncake drain` of its segment the master tells it to unmount (its objects live on other
segments by then): it does, frees the memory and keeps running without a segment, answering
health and status ("drained": true) until it is stopped, so a drained node leaves when its
operator stops it rather than looking failed to `mooncake status`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import topology
from daemons.base import Daemon
from daemons.cluster.workdir import read_json, shm_prefix
from daemons.observe.metrics import counter
from daemons.observe.store_metrics import client_families
from store.client import StoreClient


class StoreClientDaemon(Daemon):
    role = "store-client"
    tick_interval = 0.05

    def setup(self) -> None:
        # --master (an address or etcd://...) names a master on another host; else ours.
        master = self.config.master or (read_json(self.paths.announce_file("master")) or {}).get("address")
        if not master:
            raise RuntimeError("no master announced in this workdir: start the master first")
        matrix_file = self.paths.topology_file
        matrix, _ = topology.load_or_discover(
            str(matrix_file) if matrix_file.exists() else self.config.topology,
            self.config.sysfs_root, self.config.include_virtual)
        self.master = master
        self.client = StoreClient(master, self.config, segment_size=self.config.segment_size,
                                  heartbeat=False, topology=matrix, shm_prefix=shm_prefix(self.cluster_id),
                                  client_id=f"{self.name}-{self.cluster_id}-{self.started_at:.0f}")
        self.next_ping = 0.0
        self.last_status = "OK"
        self.num_pings = self.num_ping_failures = 0

    def tick(self, now: float) -> None:
        if now < self.next_ping:
            return
        interval = self.config.ping_interval
        self.last_status = self.client.owner.heartbeat(timeout=max(interval, 0.5))
        self.num_pings += 1
        self.num_ping_failures += self.last_status == "UNREACHABLE"
        self.next_ping = time.monotonic() + interval

    def teardown(self) -> None:
        if hasattr(self, "client"):
            self.client.close()

    def metric_families(self) -> Iterator[Any]:
        yield from client_families(self.client)
        yield counter("mooncake_store_client_pings_total", "Pings sent to the master", self.num_pings)
        yield counter("mooncake_store_client_ping_failures_total", "Pings the master did not answer",
                      self.num_ping_failures)

    def describe(self) -> dict[str, Any]:
        if not hasattr(self, "client"):
            return {}
        owner = self.client.owner
        # The master lets a segment-less client told only this daemon's address (the compat
        # package's setup_dummy, as the original's dummy client is) join the same pool.
        return {"client_id": self.client.client_id, "master": self.master, "segment_id": owner.segment.segment_id,
                "segment_size": owner.segment.size, "num_objects": len(owner.record),
                "num_remounts": owner.num_remounts, "master_status": self.last_status,
                "drained": owner.drained}
