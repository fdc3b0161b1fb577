"""The prefill worker: prompt in, first token and KV (to decode and to the store) out.

For each job (queued and reported as :mod:`daemons.workers.prefill_jobs` says) it loads ``load_blocks``
leading prefix blocks from the store into its pages (layer 0 first, later layers while earlier
ones compute), computes the rest of the prompt layer by layer, putting each layer's new full
blocks in the store while the next layer computes, and writes every page of the prompt into the
decode worker's reserved pages through the transfer engine. Its KV cache (one tensor) is
registered with the store client's transfer engine once, at start.
"""

from __future__ import annotations

import time

import topology
from daemons.cluster.workdir import shm_prefix
from daemons.model import BlockManager, KVCache, ModelRunner, Sequence, reusable_blocks
from daemons.serving.errors import PrefixLost
from daemons.serving.messages import PrefillReport, PrefillTimings
from daemons.workers.kv_sender import send_pages
from daemons.workers.prefill_jobs import Job, PrefillJobsDaemon
from daemons.workers.prefix_store import PrefixStore
from store.client import StoreClient


class PrefillWorkerDaemon(PrefillJobsDaemon):
    def setup_worker(self) -> None:
        matrix_file = self.paths.topology_file
        matrix = topology.load_matrix(matrix_file) if matrix_file.exists() else None
        self.store = StoreClient(self.master_address, self.config, topology=matrix,
                                 shm_prefix=shm_prefix(self.cluster_id),
                                 client_id=f"{self.name}-{self.cluster_id}-{self.started_at:.0f}")
        self.kv = KVCache(self.layout)
        self.kv_address = self.store.register_buffer(self.kv.numpy())
        self.pages = BlockManager(self.layout.num_blocks, self.layout.block_size)
        self.runner = ModelRunner(self.model, self.kv)
        self.prefix = PrefixStore(self.store, self.layout, self.kv_address)
        self.start_jobs()

    def pull_store(self) -> StoreClient:
        return self.store

    def teardown(self) -> None:
        if hasattr(self, "compute"):
            self.stop_jobs()
            self.prefix.close()
            self.store.close()
        super().teardown()

    def prefill(self, job: Job) -> PrefillReport:
        spec = job.request
        seq = Sequence.from_prompt(spec.request_id, spec.token_ids, max_tokens=1)
        self.pages.allocate(seq)
        try:
            try:
                report = self._compute(seq, spec.load_blocks, spec.store)
            except PrefixLost:
                # The prefix went out of the store between layers: the pages hold a mix, so
                # start over without it. (Rare: the master evicts least recently used first.)
                seq.num_kv_tokens = 0
                report = self._compute(seq, 0, spec.store)
            decode = spec.decode
            sent_at = time.monotonic()
            report.kv_bytes = send_pages(self.store.engine, self.layout, self.kv_address, seq.block_table,
                                         decode.segment, decode.kv_address, decode.block_ids)
            report.timings.transfer = time.monotonic() - sent_at
        finally:
            self.pages.deallocate(seq)
        return report

    def _compute(self, seq: Sequence, load_blocks: int, store: bool) -> PrefillReport:
        size = self.layout.block_size
        keys = seq.block_keys(size, seed=self.config.block_hash_seed)
        began = time.monotonic()
        hit, loads = 0, []
        wanted = reusable_blocks(len(seq), size, load_blocks)
        if wanted:
            hit, loads = self.prefix.load(keys[:wanted], seq.block_table[:wanted])
        seq.num_kv_tokens = hit * size
        computing = time.monotonic()
        waited = 0.0  # time the layers stood still for a layer of the prefix still loading
        stores = []

        def layer_done(layer: int, new_blocks: list[int]) -> None:
            nonlocal waited
            if store:
                stores.append(self.prefix.store_layer(layer, keys[hit:hit + len(new_blocks)], new_blocks))
            if layer + 1 < len(loads):
                paused = time.monotonic()
                loads[layer + 1].result()
                waited += time.monotonic() - paused

        try:
            logits = self.runner.prefill(seq, layer_done)
        except BaseException:
            for pending in [*loads[1:], *stores]:  # nothing may still move into or out of the pages
                pending.exception()
            raise
        computed = time.monotonic()
        stored = min(f.result() for f in stores) if stores else 0
        return PrefillReport(seq.seq_id, True, first_token=int(logits.argmax()), loaded_blocks=hit,
                             stored_blocks=hit + stored,
                             timings=PrefillTimings(load=computing - began + waited,
                                                    compute=computed - computing - waited,
                                                    store=time.monotonic() - computed))
