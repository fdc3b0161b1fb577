"""One process of a CPP prefill group: layers [a, b) of the model, its own KV pages, its own store.

Protocol on the job pipe from the group (``daemons.cpp_group``), in order:

    -> {"engine", "inbox"}           this stage's transfer-engine segment and inbox address
    <- {"engine", "inbox"} | None    the next stage's (None on the last stage)
    <- job {"token_ids", "pipelined", "store": "layer" | "end" | "none", "want_kv"}
    -> {"ok", "error", "logits", "logits_at", "done_at", "compute", "store_tail", "kv"}
    <- None                          stop

A pipelined job runs this stage's layers over every chunk; a short one runs on stage 0 alone
with all layers (stage 0 keeps the whole model for that). KV of the stage's own layers goes to
the store layer by layer while later layers compute ("layer"), or all of it after the last
layer ("end"), which is the comparison `mooncake bench prefill` makes. Stamps are
``time.monotonic()``, which is one clock for every process on the host.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from daemons.cpp_link import Inbox, Outbox
from daemons.model import (BlockManager, KVCache, StageModel, StageRunner, Sequence, build_model, chunk_bounds,
                           kv_layout, run_stage, split_layers)
from daemons.prefix_store import PrefixStore
from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.settings import Config

INBOX_SLOTS = 2  # one chunk being read while the next one lands


class Stage:
    def __init__(self, config: Config, index: int, stages: int, prev: Connection | None,
                 next_: Connection | None) -> None:
        torch.set_num_threads(1)  # one core per stage: the pipeline is the parallelism
        self.config = config
        model = build_model(config)
        self.layout = kv_layout(config, model)
        start, stop = split_layers(model.config.num_layers, stages)[index]
        self.runner = StageRunner(StageModel(model, start, stop), KVCache(self.layout))
        # Stage 0 runs short prompts alone, so it keeps every layer (the others drop theirs).
        self.whole = (StageRunner(StageModel(model, 0, model.config.num_layers), self.runner.kv_cache)
                      if index == 0 else None)
        self.pages = BlockManager(self.layout.num_blocks, self.layout.block_size)
        self.engine = TransferEngine(metadata="P2PHANDSHAKE", options=EngineOptions.from_config(config))
        self.chunk = config.prefill_chunk
        self.slot_tokens = chunk_bounds(0, self.chunk, self.chunk, self.layout.block_size)[0][1]
        self.inbox = (Inbox(self.engine, prev, INBOX_SLOTS, self.slot_tokens, model.config.hidden_size,
                            model.config.torch_dtype, config.rpc_timeout) if prev is not None else None)
        self.next_conn = next_
        self.outbox: Outbox | None = None
        self.store = self.prefix = None

    def hello(self) -> dict:
        return {"engine": self.engine.name, "inbox": self.inbox.address if self.inbox else 0}

    def connect(self, peer: dict | None, with_store: bool) -> None:
        if peer is not None:
            slot_bytes = self.slot_tokens * self.inbox_row_bytes()
            self.outbox = Outbox(self.engine, self.next_conn, peer["engine"], peer["inbox"], INBOX_SLOTS,
                                 slot_bytes, self.config.rpc_timeout)
        if with_store:
            from daemons.store_access import connect

            self.store = connect(self.config)
            self.prefix = PrefixStore(self.store, self.layout, self.store.register_buffer(self.runner.kv_cache.numpy()))

    def inbox_row_bytes(self) -> int:
        config = self.runner.stage.config
        return config.hidden_size * torch.empty((), dtype=config.torch_dtype).element_size()

    def close(self) -> None:
        if self.prefix is not None:
            self.prefix.close()
            self.store.close()
        self.engine.close()

    def run(self, job: dict) -> dict[str, Any]:
        seq = Sequence.from_prompt("job", job["token_ids"], max_tokens=1)
        self.pages.allocate(seq)
        try:
            return self._run(seq, job)
        finally:
            self.pages.deallocate(seq)

    def _run(self, seq: Sequence, job: dict) -> dict[str, Any]:
        runner = self.runner if job["pipelined"] else self.whole
        size = self.layout.block_size
        keys = dict(zip(seq.block_table, seq.block_keys(size, seed=self.config.block_hash_seed)))
        stores, done_layers = [], []

        def layer_done(layer: int, pages: list[int]) -> None:
            if job["store"] == "layer":
                stores.append(self.prefix.store_layer(layer, [keys[p] for p in pages], pages))
            elif job["store"] == "end":
                done_layers.append((layer, pages))

        began = time.monotonic()
        chunks = chunk_bounds(0, len(seq), self.chunk if job["pipelined"] else len(seq), size)
        logits = run_stage(runner, seq, chunks, self.inbox if job["pipelined"] else None,
                           self.outbox if job["pipelined"] else None, layer_done)
        computed = time.monotonic()
        for layer, pages in done_layers:
            stores.append(self.prefix.store_layer(layer, [keys[p] for p in pages], pages))
        for pending in stores:
            pending.result()
        done = time.monotonic()
        kv = None
        if job["want_kv"]:
            kv = {layer: [self.runner.kv_cache.export_block(p, layer) for p in seq.block_table]
                  for layer in range(runner.stage.start, runner.stage.stop)}
        return {"ok": True, "logits": None if logits is None else logits.numpy().tobytes(),
                "logits_at": computed if logits is not None else None, "done_at": done,
                "compute": computed - began, "store_tail": done - computed, "kv": kv}


def stage_main(values: dict, index: int, stages: int, jobs: Connection, prev: Connection | None,
               next_: Connection | None, with_store: bool) -> None:
    stage = Stage(Config(values), index, stages, prev, next_)
    try:
        jobs.send(stage.hello())
        stage.connect(jobs.recv(), with_store)
        jobs.send({"ok": True})
        while (job := jobs.recv()) is not None:
            try:
                jobs.send(stage.run(job))
            except Exception as exc:  # the group reports it; this stage keeps serving
                jobs.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        stage.close()
