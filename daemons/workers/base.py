"""What the prefill and decode workers share: the model, the KV layout and the conductor link.

A worker finds the conductor through its announce file (``up`` starts the conductor first), or,
started with ``--master`` on a host of its own, through the master's service table
(:mod:`daemons.cluster.service_registry`), which it reads again every ``REFRESH_INTERVAL`` so that it
follows a conductor restarted elsewhere. It heartbeats to it every ``HEARTBEAT_INTERVAL``; the
first heartbeat happens in :meth:`setup`, so a worker that `up` reports healthy is already
registered. The heartbeat carries what the conductor schedules with (KV capacity, load, and the
costs this worker measured in its start-up profile, ``calibration``, see
:mod:`daemons.workers.calibration`) and doubles as liveness: a worker silent for
``worker_timeout`` is dropped and its in-flight requests fail.

Every worker runs torch on one thread: the tiny model's matmuls are too small to share, and
stored KV is reusable bit for bit only when every worker computes it with the same thread count.
"""

from __future__ import annotations

import fcntl
import logging
import secrets
import time
from collections.abc import Iterator
from typing import Any

import torch

from daemons.base import Daemon
from daemons.cluster.advertise import advertised
from daemons.cluster.service_registry import REFRESH_INTERVAL, lookup_service
from daemons.cluster.workdir import read_json
from daemons.model import build_model, kv_layout
from daemons.observe.metrics import gauge
from daemons.serving.messages import WorkerHeartbeat
from daemons.workers.calibration import calibrate
from store.client import StoreClient
from transfer.errors import InvalidArgument, MooncakeError
from transfer.rpc.client_server import RpcClient

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 0.25  # seconds; worker_timeout (default 2 s) spans several missed beats


class WorkerDaemon(Daemon):
    tick_interval = 0.05

    def setup(self) -> None:
        torch.set_num_threads(1)
        # This process's proof that it is the worker of its name: the conductor binds the name to
        # it on the first heartbeat and takes steps and reports only with it.
        self.credential = secrets.token_hex(16)
        self.model = build_model(self.config)
        self.layout = kv_layout(self.config, self.model)
        self.master_address = self.config.master or self._announced("master")
        # The address we give the conductor: with --master it may be on another host.
        self.address = advertised(self.server.address, self.config) if self.config.master else self.server.address
        self.conductor_address = self._conductor_address()
        self.conductor_client = RpcClient(self.conductor_address, timeout=self.config.rpc_timeout,
                                          secret=self.secret)
        self.setup_worker()
        # Before the first heartbeat, so the conductor plans with this machine's costs from the
        # start; one worker of the workdir at a time (`up` starts them together), as profiles
        # run side by side time each other's work and come out slow.
        self.paths.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # absent outside `up`
        with open(self.paths.profile_lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            began = time.monotonic()
            self.calibration = calibrate(self.role, self.model, self.layout, self.config.calibration_time,
                                         self.pull_store())
        log.info("start-up profile in %.2fs: %s", time.monotonic() - began, self.calibration)
        self.next_heartbeat = 0.0
        self.next_lookup = time.monotonic() + REFRESH_INTERVAL
        self._first_heartbeat()

    def setup_worker(self) -> None:
        """Build the KV cache, engines and threads; register operations."""

    def load(self) -> dict[str, Any]:
        """What the conductor learns with each heartbeat, besides name, role and address."""
        return {}

    def pull_store(self) -> StoreClient | None:
        """The store client prefixes are pulled through, whose bandwidth the start-up profile
        measures; None: this worker pulls nothing itself."""
        return None

    def tick(self, now: float) -> None:
        if self.config.master and now >= self.next_lookup:
            self._follow_conductor()
        if now >= self.next_heartbeat:
            self._heartbeat(strict=False)

    def teardown(self) -> None:
        if hasattr(self, "conductor"):
            self.conductor_client.close()

    def describe(self) -> dict[str, Any]:
        return self.load() if hasattr(self, "layout") else {}

    def metric_families(self) -> Iterator[Any]:
        """The KV cache's size; each kind of worker adds what it keeps (queue, pages, steps)."""
        yield gauge("mooncake_worker_kv_blocks", "KV pages of this worker's cache", self.layout.num_blocks)
        yield gauge("mooncake_worker_kv_block_tokens", "Tokens one KV page holds", self.layout.block_size)

    def _announced(self, name: str) -> str:
        record = read_json(self.paths.announce_file(name))
        if not record:
            raise RuntimeError(f"no {name} announced in {self.paths.workdir}: start it first")
        return record["address"]

    def _conductor_address(self) -> str:
        if self.config.master:
            return lookup_service(self.config.master, "conductor", self.config.rpc_timeout, self.secret)["address"]
        return self._announced("conductor")

    def _follow_conductor(self) -> None:
        """Move to the conductor the master names now, if it moved; threads calling the old
        client meanwhile get an RpcError and log it, as for any lost report."""
        self.next_lookup = time.monotonic() + REFRESH_INTERVAL
        try:
            address = self._conductor_address()
        except MooncakeError as exc:
            log.warning("could not look the conductor up at the master: %s", exc)
            return
        if address != self.conductor_address:
            log.info("the conductor moved from %s to %s", self.conductor_address, address)
            old, self.conductor_address = self.conductor_client, address
            self.conductor_client = RpcClient(address, timeout=self.config.rpc_timeout, secret=self.secret)
            old.close()

    def _first_heartbeat(self) -> None:
        """Register with the conductor; a failure stops the start. While our predecessor under
        this name (a restart) still counts as live there, the conductor refuses the name: it is
        ours once that one has been silent for worker_timeout."""
        deadline = time.monotonic() + self.config.worker_timeout + 2 * HEARTBEAT_INTERVAL
        while True:
            try:
                self._heartbeat(strict=True)
                return
            except InvalidArgument as exc:
                if "a live" not in exc.message or time.monotonic() > deadline:
                    raise
                time.sleep(HEARTBEAT_INTERVAL / 4)

    def _heartbeat(self, strict: bool) -> None:
        self.next_heartbeat = time.monotonic() + HEARTBEAT_INTERVAL
        beat = WorkerHeartbeat(self.name, self.role, self.address, self.layout.num_blocks * self.layout.block_size,
                               self.credential, self.calibration, self.load())
        try:
            self.conductor_client.call("conductor.heartbeat", beat.to_wire(), timeout=min(self.config.rpc_timeout, 1.0))
        except MooncakeError as exc:
            if strict:
                raise
            log.warning("heartbeat to the conductor failed: %s", exc)
