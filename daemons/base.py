"""The loop every daemon shares: serve RPC, tick, and stop cleanly on SIGTERM.

A daemon subclass registers its operations in :meth:`Daemon.setup`, may do periodic work in
:meth:`Daemon.tick`, and releases what it owns in :meth:`Daemon.teardown`. The signal handler
only sets an event (gunicorn's rule: handlers enqueue, the loop acts); the main thread then
drains in-flight requests up to ``drain_timeout`` and exits.

Every daemon answers ``health`` (cheap liveness), ``status`` (role, pid, uptime, counters) and
``echo`` (returns its arguments and frames; the RPC benchmark uses it). Unless ``metrics_port`` is
0 it also serves Prometheus ``/metrics`` over HTTP (:mod:`daemons.observe`): the series
:meth:`Daemon.metric_families` reads from its live state at each scrape, on a free port (announced
as ``metrics_url``) or, for a daemon that sets :attr:`Daemon.metrics_bind_port`, on that one.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from functools import cached_property
from typing import Any, ClassVar


from daemons.cluster.workdir import ClusterPaths, write_json_atomic
from transfer.auth import cluster_secret
from transfer.rpc.client_server import Reply, Request, RpcServer
from transfer.settings import Config

log = logging.getLogger(__name__)


class Daemon:
    role: ClassVar[str] = "daemon"
    tick_interval: ClassVar[float] = 0.5
    # The ops a tenant's credential may ask for (transfer.rpc.client_server); none: only the
    # cluster secret admits a client.
    tenant_ops: ClassVar[frozenset[str]] = frozenset()
    # The port of the HTTP metrics server: 0, a free one (several daemons share a host); a master
    # started on its own (`mooncake start master`) takes metrics_port, as mooncake_master does.
    metrics_bind_port = 0
    metrics_http = None  # the HTTP metrics server while it runs (daemons.asgi.server.HttpServer)

    def __init__(self, name: str, paths: ClusterPaths, config: Config, cluster_id: str,
                 port: int = 0) -> None:
        self.name = name
        self.paths = paths
        self.config = config
        self.cluster_id = cluster_id
        self.started_at = time.time()
        self.stop_requested = threading.Event()
        # Its own server and every client it opens to other daemons require or present it.
        self.secret = cluster_secret(config)
        self.server = RpcServer(
            # Port 0 picks a free one; a restarted daemon asks for its old port so peers'
            # sockets reconnect to it by themselves.
            f"tcp://{config.bind_host}:{port or '*'}",
            max_message_size=config.rpc_max_message_size,
            max_buffered_bytes=config.rpc_max_buffered_bytes,
            handler_threads=config.rpc_handler_threads,
            busy_poll=config.rpc_busy_poll,
            secret=self.secret,
            tenant_ops=self.tenant_ops,
        )
        self.ipc_address = self._bind_ipc()

    def _bind_ipc(self) -> str | None:
        """Also listen on the Unix stream socket ``<workdir>/run/<name>.sock``: a client on this
        host skips both ZeroMQ I/O threads and the TCP stack, well over half a round trip
        (:mod:`transfer.rpc.stream`). ``address`` stays the TCP endpoint, what other hosts use.
        A bind that fails (a workdir path too long for a Unix socket, a file system without
        sockets) leaves the daemon on TCP alone. A file left by a killed predecessor is replaced."""
        path = self.paths.ipc_socket(self.name)
        try:
            return self.server.bind(f"unix://{path}")
        except OSError as exc:
            log.warning("%s: no Unix socket endpoint at %s (%s); serving on TCP only", self.name, path, exc)
            return None

    # -- what subclasses fill in ------------------------------------------------------------

    def setup(self) -> None:
        """Register operations on ``self.server``; acquire resources."""

    def tick(self, now: float) -> None:
        """Periodic work on the main thread (liveness checks, heartbeats)."""

    def teardown(self) -> None:
        """Release what :meth:`setup` acquired."""

    def describe(self) -> dict[str, Any]:
        """Role-specific facts for ``status`` and the announce file."""
        return {}

    def metric_families(self) -> Iterable[Any]:
        """The daemon's Prometheus metric families, read from its live state at each scrape."""
        return ()

    def http_app(self) -> Any:
        """The ASGI app its metrics port serves: ``/metrics`` and ``/health``."""
        from daemons.observe.daemon_http import metrics_app

        return metrics_app(self.metrics_registry, self.role)

    @cached_property
    def metrics_registry(self) -> Any:
        """This daemon's own prometheus_client registry."""
        # Imported on first use: `mooncake status` imports this module (through the launcher)
        # and must not pay for prometheus_client, FastAPI and uvicorn.
        from daemons.observe.registry import daemon_registry

        return daemon_registry(self.metric_families)

    # -- the shared loop --------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._request_stop)
        signal.signal(signal.SIGINT, self._request_stop)
        self.server.register("health", self._health)
        self.server.register("status", self._status)
        self.server.register("echo", lambda request: Reply(request.args, request.frames))
        tune_collector(self.config.gc_threshold)
        try:
            self.setup()
            # What setup built (modules, a model's weights) lives as long as the process: keep
            # the cycle collector from rescanning it on every full pass.
            gc.freeze()
            self._serve_metrics()
            self.server.start()
            write_json_atomic(self.paths.announce_file(self.name), {
                "name": self.name, "role": self.role, "pid": os.getpid(),
                "address": self.server.address, "started_at": self.started_at,
                # The host name lets a client that reads this file from a shared workdir tell
                # whether the ipc endpoint is on its own host.
                "hostname": socket.gethostname(),
                **({"ipc_address": self.ipc_address} if self.ipc_address else {}),
                **self._metrics_url(),
                **self.describe(),
            })
            log.info("%s %s serving on %s", self.role, self.name, self.server.address)
            while not self.stop_requested.wait(self.tick_interval):
                self.tick(time.monotonic())
        except Exception as exc:
            log.exception("%s %s failed", self.role, self.name)
            self._record_exit(f"crashed: {type(exc).__name__}: {exc}")
            self._shutdown()
            return 1
        log.info("%s %s stopping: draining in-flight requests", self.role, self.name)
        self._shutdown()
        self._record_exit("stopped by SIGTERM")
        return 0

    def _serve_metrics(self) -> None:
        if self.config.metrics_port:
            from daemons.observe.daemon_http import serve

            self.metrics_http = serve(self.http_app(), self.config.bind_host, self.metrics_bind_port, self.role)

    def _metrics_url(self) -> dict[str, str]:
        return {"metrics_url": f"{self.metrics_http.url}/metrics"} if self.metrics_http is not None else {}

    def _shutdown(self) -> None:
        if self.metrics_http is not None:
            self.metrics_http.close()
        self.server.stop(self.config.drain_timeout)  # which also removes the socket file
        self.teardown()

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested.set()

    def _record_exit(self, reason: str) -> None:
        write_json_atomic(self.paths.exit_file(self.name), {"reason": reason, "at": time.time()})

    def _health(self, request: Request) -> dict[str, Any]:
        return {"ok": True, "name": self.name, "role": self.role}

    def _status(self, request: Request) -> dict[str, Any]:
        return {
            "name": self.name, "role": self.role, "pid": os.getpid(),
            "address": self.server.address, "uptime_s": time.time() - self.started_at,
            "num_served": self.server.num_served, **self._metrics_url(), **self.describe(),
        }


def tune_collector(young_threshold: int) -> None:
    """Young passes of the cycle collector every ``young_threshold`` allocations (0: leave the
    interpreter's defaults), middle ones every 5 of them, full ones every 1000 middle ones: a
    daemon's long-lived state (a master's object records) is no longer rescanned whole each
    time it grows by a quarter."""
    if young_threshold:
        gc.set_threshold(young_threshold, 5, 1000)
