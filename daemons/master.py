"""The master daemon: the cluster's metadata authority.

It serves the transfer engine's segment-descriptor metadata service (``te.meta.*``), so every
engine of the cluster finds its peers' buffers through it, and the store's object metadata
(``store.*``: segments, replicas, leases, pins, eviction; see :mod:`store.master_service`), and
the table through which daemons on other hosts find the conductor (``cluster.*``; see
:mod:`daemons.cluster.service_registry`). It never touches object bytes. Its tick evicts above the
watermark and drops silent store clients.

It publishes the store's KV events (replicas stored and removed, in vLLM's KV-event shape; see
:mod:`store.events`) on a ZeroMQ PUB socket bound on ``bind_host:kv_events_port``, with vLLM's
replay socket beside it on ``kv_events_replay_port``; both addresses are in its announce record,
cluster.json and ``status`` as ``kv_events_address`` and ``kv_events_replay_address``.

Its HTTP server (``metrics_port``; :mod:`daemons.observe.master_http`) serves Prometheus
``/metrics`` with Mooncake's ``master_*`` series (:mod:`daemons.observe.master_metrics`, every op's
requests and failures counted as it runs), ``/health``, ``/role``, ``/leader`` and Mooncake's
inspection endpoints (``/query_key``, ``/batch_query_keys``, ``/get_all_segments``,
``/query_segment``, ...).

Started on its own (`mooncake start master`, :func:`run_master`) it binds ``metrics_port`` itself
(9003, as mooncake_master) and may also serve Mooncake's HTTP metadata protocol (:mod:`transfer.metadata.http_backend`) from the same process, for
transfer engines given ``metadata_server="http://host:port/metadata"``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import yaml

from daemons.base import Daemon
from daemons.cluster.advertise import advertise_host
from daemons.cluster.service_registry import ServiceTable
from daemons.cluster.workdir import ClusterPaths
from daemons.errors import AddressNotReachable, MetadataServerUnavailable
from daemons.ha.master_election import start_election
from daemons.launcher import run_in_foreground
from store.events.publisher import KvEventPublisher
from store.master_service import TENANT_OPS, StoreService
from transfer.auth import cluster_secret
from transfer.metadata.http_backend import HttpMetadataServer
from transfer.metadata.table import MetadataTable, serve_metadata
from transfer.settings import Config

log = logging.getLogger(__name__)

METADATA_EXPIRY_INTERVAL = 10.0  # seconds between sweeps of the segment descriptors' TTL


class MasterDaemon(Daemon):
    role = "master"
    tick_interval = 0.05  # eviction and liveness react within 50 ms (Mooncake polls every 10 ms)
    tenant_ops = TENANT_OPS  # a tenant's credential reaches its own keys (store.master_service)

    election = None  # with ha_backend etcd: this master's campaign (daemons.ha.master_election)
    oplog = None  # and its op-log writer
    http_metadata_url = ""  # the HTTP metadata server run beside it (run_master), if any
    metrics = None  # with metrics_port: its series and HTTP endpoints (daemons.observe.master_metrics)

    def setup(self) -> None:
        try:
            host = advertise_host(self.config)
        except AddressNotReachable:
            host = ""  # bound on every interface and none named: say what was bound
        # One publisher for the process: a leader's fresh state (HA) publishes on the same socket.
        self.kv_events = KvEventPublisher(self.config.bind_host, self.config.kv_events_port,
                                          self.config.kv_events_replay_port, host, self.secret)
        if self.config.metrics_port:
            # Imported only to serve them: prometheus_client and Starlette add 50 ms to every start.
            from daemons.observe.master_metrics import MasterMetrics

            self.metrics = MasterMetrics(self)
        if self.config.ha_backend == "etcd":
            self.election = start_election(self, self._install_state)
        else:
            self._install_state(self.server)

    def _install_state(self, server: Any) -> None:
        """Fresh, empty metadata and store state, its ops registered on ``server``."""
        if self.metrics is not None:
            server = self.metrics.counted(server)
        self.segment_descriptors = MetadataTable(self.config.metadata_max_entries)
        self.next_metadata_expiry = 0.0
        serve_metadata(server, self.segment_descriptors)
        self.store = StoreService(self.config, self.kv_events, self.secret)
        self.store.register(server)
        self.services = ServiceTable(max_entries=self.config.metadata_max_entries)
        self.services.register(server)

    def tick(self, now: float) -> None:
        self.store.tick(now)
        if now >= self.next_metadata_expiry:
            self.next_metadata_expiry = now + METADATA_EXPIRY_INTERVAL
            for name in self.segment_descriptors.expire(self.config.metadata_ttl):
                log.info("segment descriptor %s not published for %gs: dropped", name, self.config.metadata_ttl)

    def teardown(self) -> None:
        if self.election is not None:
            self.election.stop()
        if self.oplog is not None:
            self.oplog.stop()
        if hasattr(self, "kv_events"):
            self.kv_events.close()

    def metric_families(self) -> Iterable[Any]:
        return self.metrics.families()

    def http_app(self) -> Any:
        return self.metrics.app()

    def describe(self) -> dict[str, Any]:
        ha = {"ha": {"leading": self.election.leading, "address": self.election.address}} if self.election else {}
        http = {"http_metadata_server": self.http_metadata_url} if self.http_metadata_url else {}
        events = {"kv_events_address": self.kv_events.address,
                  "kv_events_replay_address": self.kv_events.replay_address} if hasattr(self, "kv_events") else {}
        return {"num_segment_descriptors": len(self.segment_descriptors.names()),
                **self.store.describe(), **events, **ha, **http}


def run_master(paths: ClusterPaths, config: Config, name: str, port: int, http: tuple[str, int] | None) -> int:
    """One master in this process (`mooncake start master --foreground`), founding the
    workdir's cluster, with an HTTP metadata server on ``http`` (host, port) beside it if asked."""
    paths.workdir.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_text(yaml.safe_dump(config.as_plain(), sort_keys=True))
    try:
        secret = cluster_secret(config)
        metadata = HttpMetadataServer(*http, max_entries=config.metadata_max_entries,
                                      token=secret.http_token if secret else None) if http else None
    except OSError as exc:
        raise MetadataServerUnavailable(f"cannot serve HTTP metadata on {http[0]}:{http[1]}: {exc.strerror}") from None

    def make(cluster_id: str) -> MasterDaemon:
        daemon = MasterDaemon(name, paths, config, cluster_id, port)
        daemon.metrics_bind_port = config.metrics_port
        daemon.http_metadata_url = metadata.url if metadata else ""
        return daemon

    try:
        return run_in_foreground(paths, "master", name, make, founds_cluster=True,
                                 entry={"http_metadata_server": metadata.url} if metadata else {})
    finally:
        if metadata is not None:
            metadata.close()
