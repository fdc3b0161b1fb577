"""The conductor daemon: the scheduler policy, live, with an HTTP front end.

RPC operations the workers call (see :mod:`daemons.serving` for what each does)::

    conductor.heartbeat     {"name", "role", "address", "kv_capacity_tokens", ...load}
    conductor.prefill_done  a prefill worker's report (daemons.prefill_worker)
    conductor.tokens        a decode worker's step (daemons.decode_worker)

Its tick drops workers whose heartbeats stopped. The HTTP front end (``http_port``, 0: any free
port) is announced as ``http_address`` in its announce record and cluster.json, which is how
`mooncake generate` and `mooncake bench serve` find it. It never loads the model: the tokenizer
and the vocabulary size are all it needs to check prompts.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from daemons.base import Daemon
from daemons.http_frontend import FrontEnd
from daemons.model import ByteTokenizer, ModelConfig, build_tokenizer
from daemons.serving import ServingService


def vocab_size(config: Any, tokenizer: ByteTokenizer | None) -> int:
    if tokenizer is not None:
        return tokenizer.vocab_size
    hf = json.loads((Path(config.model_dir) / "config.json").read_text())
    return ModelConfig.from_hf(hf).vocab_size


class ConductorDaemon(Daemon):
    role = "conductor"
    tick_interval = 0.1

    def setup(self) -> None:
        self.service = ServingService(self.config)
        self.server.register("conductor.heartbeat", self.service.heartbeat)
        # A late report frees an orphan's decode pages with a call to the worker: off the I/O thread.
        self.server.register("conductor.prefill_done", self.service.prefill_done, blocking=True)
        self.server.register("conductor.tokens", self.service.tokens)
        tokenizer = build_tokenizer(self.config)
        self.http = FrontEnd(self.config.bind_host, self.config.http_port, self.service, tokenizer,
                             vocab_size(self.config, tokenizer), self.config.http_max_body,
                             self.config.default_max_tokens)
        self.http_thread = threading.Thread(target=self.http.serve_forever, name="http", daemon=True)
        self.http_thread.start()

    def tick(self, now: float) -> None:
        self.service.check_liveness(now)

    def teardown(self) -> None:
        if hasattr(self, "http"):
            self.http.shutdown()
            self.http.server_close()

    def describe(self) -> dict[str, Any]:
        if not hasattr(self, "http"):
            return {}
        gauges = self.service.gauges()
        return {"http_address": self.http.url,
                "prefill_workers": int(gauges[("mooncake_workers", (("role", "prefill"),))]),
                "decode_workers": int(gauges[("mooncake_workers", (("role", "decode"),))])}
