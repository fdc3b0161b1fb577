"""The conductor daemon: the scheduler policy, live, with an HTTP front end.

RPC operations the workers call (see :mod:`daemons.serving.service` for what each does)::

    conductor.heartbeat     {"name", "role", "address", "kv_capacity_tokens", ...load}
    conductor.prefill_done  a prefill worker's report (daemons.workers.prefill)
    conductor.tokens        a decode worker's step (daemons.workers.decode)
    conductor.index         {"blocks"?: [32-hex block key]} -> sizes of the cache index, the
                            holders of those blocks, and where its KV-event stream stands

Its tick drops workers whose heartbeats stopped. A thread it owns follows the master's KV events
into the cache index (:mod:`daemons.serving.kv_events`); the master is ``--master`` or the one
announced in the workdir. The HTTP front end (:mod:`daemons.serving.http_frontend`, served by
uvicorn on a thread with its own event loop; ``http_port``, 0: any free port) is announced as
``http_address`` in its announce record and cluster.json, which is how `mooncake generate` and
`mooncake bench serve` find it, beside ``kv_block_tokens``, the block size they build prompts
for. Started with ``--master`` (on a host of its own), it also registers
both addresses and the block size with the master as the ``conductor`` service and keeps them
registered (:mod:`daemons.cluster.service_registry`), so workers and `mooncake generate --master`
on other hosts find it there. It never loads the model: the tokenizer and the vocabulary size
are all it needs to check prompts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from daemons.base import Daemon
from daemons.cluster.advertise import advertise_host, advertised
from daemons.cluster.service_registry import ServiceRegistration
from daemons.cluster.workdir import read_json
from daemons.model import ModelConfig, Tokenizer, build_tokenizer
from daemons.serving.errors import BadRequest
from daemons.serving.http_frontend import RANDOM_MODEL_ID, build_app
from daemons.asgi.server import HttpServer
from daemons.serving.kv_events import KvEventSubscriber
from daemons.serving.service import ServingService
from scheduler.block_hash import parse_key

log = logging.getLogger(__name__)

MAX_INDEX_QUERY = 1024  # block keys one conductor.index call may ask about


def vocab_size(config: Any, tokenizer: Tokenizer | None) -> int:
    """Token ids a prompt may hold: the model's embedding rows (a checkpoint pads them past its
    tokenizer's vocabulary, and its greedy output may use any of them)."""
    if not config.model_dir:
        return tokenizer.vocab_size
    hf = json.loads((Path(config.model_dir) / "config.json").read_text())
    return ModelConfig.from_hf(hf).vocab_size


def served_model_id(config: Any) -> str:
    """The model's name in /v1/models: its checkpoint directory's, or the random model's."""
    return Path(config.model_dir).resolve().name if config.model_dir else RANDOM_MODEL_ID


class ConductorDaemon(Daemon):
    role = "conductor"
    tick_interval = 0.1

    registration = None  # with --master: our record kept registered there
    kv_events = None  # the thread following the master's KV events into the cache index

    def setup(self) -> None:
        self.service = ServingService(self.config)
        self.server.register("conductor.heartbeat", self.service.heartbeat)
        # A late report frees an orphan's decode pages with a call to the worker: off the I/O thread.
        self.server.register("conductor.prefill_done", self.service.prefill_done, blocking=True)
        self.server.register("conductor.tokens", self.service.tokens)
        self.server.register("conductor.index", self._index)
        master = self.config.master or (read_json(self.paths.announce_file("master")) or {}).get("address")
        if master:
            self.kv_events = KvEventSubscriber(master, self.service, self.config.rpc_timeout, self.secret).start()
        else:
            log.warning("no master to follow: the cache index stays empty")
        tokenizer = build_tokenizer(self.config)
        app = build_app(self.service, tokenizer, vocab_size(self.config, tokenizer), served_model_id(self.config),
                        self.config.http_max_body, self.config.default_max_tokens,
                        read_timeout=self.config.http_read_timeout)
        self.http = HttpServer(app, self.config.bind_host, self.config.http_port, self.config.drain_timeout,
                               header_timeout=self.config.http_read_timeout).start(self.config.start_timeout)
        if self.config.master:
            # Other hosts need the address they can reach, not the one we bound.
            http_port = self.http.port
            self.registration = ServiceRegistration(self.config.master, {
                "name": "conductor", "address": advertised(self.server.address, self.config),
                "http_address": f"http://{advertise_host(self.config)}:{http_port}",
                "kv_block_tokens": self.config.kv_block_tokens}, self.config.rpc_timeout, self.secret)
            self.registration.refresh(strict=True)

    def tick(self, now: float) -> None:
        self.service.check_liveness(now)
        if self.registration is not None:
            self.registration.tick(now)

    def _shutdown(self) -> None:
        # The front end first: streams in flight may finish (for drain_timeout) while the workers
        # can still report their tokens, which they do over the RPC server stopped next.
        if hasattr(self, "http"):
            self.http.close()
        super()._shutdown()

    def teardown(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()
        if self.registration is not None:
            self.registration.close()

    def _index(self, request: Any) -> dict[str, Any]:
        wanted = request.args.get("blocks", [])
        try:
            if not isinstance(wanted, list) or len(wanted) > MAX_INDEX_QUERY \
                    or not all(isinstance(key, str) for key in wanted):
                raise ValueError(f"blocks must be a list of at most {MAX_INDEX_QUERY} block keys")
            blocks = [parse_key(key) for key in wanted]
        except ValueError as exc:
            raise BadRequest(f"conductor.index: {exc}") from None
        events = self.kv_events.stats() if self.kv_events is not None else {}
        return {**self.service.index_view(blocks), "kv_events": events}

    def describe(self) -> dict[str, Any]:
        if not hasattr(self, "http"):
            return {}
        workers = self.service.worker_counts()
        return {"http_address": self.http.url, "kv_block_tokens": self.config.kv_block_tokens,
                "prefill_workers": workers["prefill"], "decode_workers": workers["decode"]}
