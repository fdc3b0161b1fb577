"""One process of a CPP prefill group: layers [a, b) of the model, its own KV pages, its own store client.

The layers, pages and activations are on the model_device; hidden states cross to the next stage
through host memory (:mod:`daemons.workers.cpp.link`), KV to the store and the decode worker
through the transfer engine's staging of GPU memory, as on a plain prefill worker.

Protocol on the job pipe from the group (``daemons.workers.cpp.group``), in order:

    -> {"engine", "inbox"}           this stage's transfer-engine segment and inbox address
    <- {"engine", "inbox"} | None    the next stage's (None on the last stage)
    -> {"ok", "segment"}             the segment this stage contributes to the store (stage 0 of
                                     a group with an instance-local cache), else None
    <- segment | None                the group's segment
    <- job {"token_ids", "pipelined", "store": "layer" | "end" | "none", "want_kv", "wait_store",
            "load_blocks", "local_blocks", "source_segment", "replicate",
            "decode": {"segment", "kv_address", "block_ids"} | None}
    -> {"ok", "error", "loaded", "load_s"}   leading prefix blocks now in this stage's layers
    <- start | None                  tokens every stage holds (the group's least "loaded"
                                     blocks); None: another stage failed, drop the job
    -> {"ok", "error", "logits", "logits_at", "sent_at", "done_at", "compute", "store_tail", "stored",
        "replicated", "transfer", "kv_bytes", "kv"}
    <- None                          stop

The group's segment is its instance-local cache: stage 0's store client contributes it
(``prefill_segment_size`` bytes, under the client id the group names), and every stage uses it
as a plain prefill worker uses its own (:class:`daemons.workers.prefix_store.PrefixStore`): it
reads the leading ``local_blocks`` of its layers from there and the rest from
``source_segment``, puts its layers of new blocks there first, and with ``replicate`` keeps a
copy there of its layers of the blocks it pulled.

A pipelined job runs this stage's layers over every chunk; a short one runs on stage 0 alone
with all layers (stage 0 keeps the whole model for that). Each stage loads a cached prefix of
its own layers from the store, whole, before any chunk moves: the stages must agree on where
computing starts, and a prefix that left the store mid-pipeline would strand the neighbours.
KV of the stage's own layers goes to the store layer by layer while later layers compute
("layer"), or all of it after the last layer ("end"), which is the comparison `mooncake bench
prefill` makes; and, with "decode", into the decode worker's reserved pages (this stage's layers
of each page), each layer as soon as its last chunk is computed, while the next layer computes.
With "wait_store" (default) a stage answers once its puts ended ("stored" counts the leading new
blocks that went in); without it (the serving group) it answers once its KV is in decode's
pages, "stored" counts the new blocks being put, and the job's pages are freed when they end.
Stamps are ``time.monotonic()``, which is one clock for every process on the host.
"""

from __future__ import annotations

import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from daemons.workers.cpp.link import Inbox, Outbox
from daemons.workers.kv_sender import KvSender
from daemons.workers.prefill_pages import PrefillPages
from daemons.model import (KVCache, StageModel, StageRunner, Sequence, build_model, chunk_bounds,
                           kv_layout, reusable_blocks, run_stage, split_layers)
from daemons.model.device import synchronize
from daemons.serving.errors import PrefixLost
from daemons.workers.prefix_store import PrefixStore
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
        self.runner = StageRunner(StageModel(model, start, stop), KVCache(self.layout, device=model.device))
        # Stage 0 runs short prompts alone, so it keeps every layer (the others drop theirs).
        self.whole = (StageRunner(StageModel(model, 0, model.config.num_layers), self.runner.kv_cache)
                      if index == 0 else None)
        self.pages = PrefillPages(self.layout.num_blocks, self.layout.block_size)
        self.engine = TransferEngine(metadata="P2PHANDSHAKE", options=EngineOptions.from_config(config))
        self.chunk = config.prefill_chunk
        # A chunk is prefill_chunk rounded up to whole blocks (chunk_bounds), even when that
        # is more than prefill_chunk tokens: a chunk smaller than a block is one block.
        size = self.layout.block_size
        self.slot_tokens = -(-self.chunk // size) * size
        self.inbox = (Inbox(self.engine, prev, INBOX_SLOTS, self.slot_tokens, model.config.hidden_size,
                            model.config.torch_dtype, model.device, config.rpc_timeout) if prev is not None else None)
        self.next_conn = next_
        self.outbox: Outbox | None = None
        self.store = self.prefix = self.sender = None
        self.kv_address = 0
        self.local_blocks = 0  # the job's leading blocks read from the group's segment
        self.seq: Sequence | None = None  # the job between its load and its run
        self.job: dict = {}

    def hello(self) -> dict:
        return {"engine": self.engine.name, "inbox": self.inbox.address if self.inbox else 0}

    def connect(self, peer: dict | None, with_store: bool | tuple[str, str], segment_owner: str | None) -> str | None:
        """Link to the next stage and the store; with ``segment_owner`` (a client id) contribute
        the group's segment. Returns that segment's id, or None."""
        if peer is not None:
            slot_bytes = self.slot_tokens * self.inbox_row_bytes()
            self.outbox = Outbox(self.engine, self.next_conn, peer["engine"], peer["inbox"], INBOX_SLOTS,
                                 slot_bytes, self.config.rpc_timeout)
        if not with_store:
            return None
        from daemons.cluster.store_access import connect_to, master_of

        master, cluster_id = with_store if isinstance(with_store, tuple) else master_of(self.config)
        segment_size = self.config.prefill_segment_size if segment_owner else 0
        self.store = connect_to(self.config, master, cluster_id, segment_size=segment_size, client_id=segment_owner)
        self.kv_address = self.store.register_buffer(self.runner.kv_cache.transfer_buffer())
        self.sender = KvSender(self.store.engine, self.layout, self.kv_address)
        return self.store.owner.segment.segment_id if self.store.owner else None

    def join(self, segment: str | None) -> None:
        """Use the group's ``segment`` (None: it has none) as this stage's instance-local cache."""
        if self.store is not None:
            self.prefix = PrefixStore(self.store, self.layout, self.kv_address, segment)

    def inbox_row_bytes(self) -> int:
        config = self.runner.stage.config
        return config.hidden_size * torch.empty((), dtype=config.torch_dtype).element_size()

    def close(self) -> None:
        if self.prefix is not None:
            self.sender.close()
            self.prefix.close()
            self.store.close()
        self.engine.close()

    def load(self, job: dict) -> int:
        """Take the job's pages and load its cached prefix into this stage's layers; how many
        leading blocks every one of those layers now holds."""
        self.job, self.seq = job, Sequence.from_prompt("job", job["token_ids"], max_tokens=1)
        self.pages.take(self.seq, timeout=self.config.request_timeout)
        runner = self.runner if job["pipelined"] else self.whole
        wanted = reusable_blocks(len(self.seq), self.layout.block_size, job.get("load_blocks", 0))
        local = job.get("local_blocks")
        self.local_blocks = wanted if local is None else min(local, wanted)
        if not wanted or self.prefix is None:
            return 0
        keys = self.seq.block_keys(self.layout.block_size, seed=self.config.block_hash_seed)[:wanted]
        hit, loads = self.prefix.load(keys, self.seq.block_table[:wanted],
                                      range(runner.stage.start, runner.stage.stop),
                                      local_blocks=self.local_blocks, source_segment=job.get("source_segment"))
        try:
            for pending in loads[1:]:
                pending.result()
        except PrefixLost:
            return 0  # how many of a later layer's blocks survived is unknown: recompute them all
        return hit

    def release(self) -> None:
        if self.seq is not None:
            seq, self.seq = self.seq, None
            if self.prefix is not None:  # puts may still read the pages
                self.prefix.when_stored(lambda: self.pages.give_back(seq))
            else:
                self.pages.give_back(seq)

    def run(self, start: int) -> dict[str, Any]:
        """Compute the job from token ``start`` on (the KV before it is in every stage)."""
        seq, job = self.seq, self.job
        seq.num_kv_tokens = start
        runner = self.runner if job["pipelined"] else self.whole
        size = self.layout.block_size
        block_keys = seq.block_keys(size, seed=self.config.block_hash_seed)
        keys = dict(zip(seq.block_table, block_keys))
        stores, done_layers = [], []
        chunks = chunk_bounds(start, len(seq), self.chunk if job["pipelined"] else len(seq), size)
        decode = job.get("decode")
        # Each stage writes its own layers: no stage waits for another's KV, and none of it
        # crosses a second process on the way to the decode worker. A layer goes as soon as
        # the last chunk computed it, while this stage computes its next layer.
        stream = (self.sender.stream(seq.block_table, decode["segment"], decode["kv_address"], decode["block_ids"])
                  if decode else None)
        chunks_done = dict.fromkeys(range(runner.stage.start, runner.stage.stop), 0)

        def layer_done(layer: int, pages: list[int]) -> None:
            chunks_done[layer] += 1
            if stream is not None and chunks_done[layer] == len(chunks):
                stream.send_layers(layer, layer + 1)
            if job["store"] == "layer":
                stores.append((pages, self.prefix.store_layer(layer, [keys[p] for p in pages], pages)))
            elif job["store"] == "end":
                done_layers.append((layer, pages))

        began = time.monotonic()
        try:
            logits = run_stage(runner, seq, chunks, self.inbox if job["pipelined"] else None,
                               self.outbox if job["pipelined"] else None, layer_done)
            synchronize(runner.stage.device)  # on a GPU the layers may still run: compute ends here
            computed = time.monotonic()
            kv_bytes = stream.wait() if stream is not None else 0
        finally:
            if stream is not None:
                stream.settle()  # the pages are freed after the job
        sent = time.monotonic()
        for layer, pages in done_layers:
            stores.append((pages, self.prefix.store_layer(layer, [keys[p] for p in pages], pages)))
        # Hot-block replication, after the KV went to decode (off the TTFT path): keep this
        # stage's layers of the blocks pulled from another segment, from the pages it holds.
        hit = start // size
        pulled = max(0, hit - self.local_blocks)
        keep = bool(job["store"] != "none" and job.get("replicate") and self.prefix.segment and pulled)
        if keep:
            self.prefix.keep(block_keys[self.local_blocks:hit], seq.block_table[self.local_blocks:hit],
                             range(runner.stage.start, runner.stage.stop))
        if job.get("wait_store", True):
            stored = _leading_stored(runner.stage.stop - runner.stage.start, stores)
        else:  # answer now; the puts end in the background (what the serving group does)
            stored = len(seq) // size - start // size if job["store"] != "none" else 0
        done = time.monotonic()
        kv = None
        if job["want_kv"]:
            kv = {layer: [self.runner.kv_cache.export_block(p, layer) for p in seq.block_table]
                  for layer in range(runner.stage.start, runner.stage.stop)}
        return {"ok": True, "logits": None if logits is None else logits.cpu().numpy().tobytes(),
                "logits_at": computed if logits is not None else None, "sent_at": sent, "done_at": done,
                "compute": computed - began, "store_tail": done - sent, "stored": stored,
                "replicated": pulled if keep else 0,
                "transfer": sent - computed, "kv_bytes": kv_bytes, "kv": kv}


def _leading_stored(num_layers: int, stores: list[tuple[list[int], Any]]) -> int:
    """New blocks in the store in every one of this stage's layers, counted from the first.

    ``stores`` holds (pages, future) per layer per chunk, each layer's chunks in order; a
    future yields how many of its pages' leading blocks went in."""
    per_layer: list[int] = []
    for layer in range(num_layers):
        total = 0
        for pages, pending in stores[layer::num_layers]:
            count = pending.result()
            total += count
            if count < len(pages):
                break
        per_layer.append(total)
    return min(per_layer) if stores else 0


def stage_main(values: dict, index: int, stages: int, jobs: Connection, prev: Connection | None,
               next_: Connection | None, with_store: bool | tuple[str, str], segment_owner: str | None) -> None:
    # `mooncake down` signals a daemon's children too; a stage leaves when its group says so or
    # its pipe closes (the group's process is gone), so that it frees its shared memory first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stage = Stage(Config(values), index, stages, prev, next_)
    try:
        jobs.send(stage.hello())
        jobs.send({"ok": True, "segment": stage.connect(jobs.recv(), with_store, segment_owner)})
        stage.join(jobs.recv())
        while (job := jobs.recv()) is not None:
            try:
                started = time.monotonic()
                jobs.send({"ok": True, "loaded": stage.load(job), "load_s": time.monotonic() - started})
            except Exception as exc:  # the group drops the job; this stage keeps serving
                jobs.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            try:
                if (start := jobs.recv()) is not None:
                    jobs.send(stage.run(start))
            except Exception as exc:  # the group reports it; this stage keeps serving
                jobs.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            finally:
                stage.release()
    finally:
        stage.close()
