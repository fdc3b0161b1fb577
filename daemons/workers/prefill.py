"""The prefill worker: prompt in, first token and KV (to decode and to the store) out.

Each worker owns a store segment of ``prefill_segment_size`` bytes of its own memory, its
instance-local KV cache, and says its id in every heartbeat (``segment``) so the conductor knows
which blocks are local to it. For each job (queued and reported as
:mod:`daemons.workers.prefill_jobs` says) it:

- loads the ``load_blocks`` leading prefix blocks the conductor chose (Algorithm 1): the first
  ``local_blocks`` from its own segment only, the rest from ``source_segment`` (a transfer:
  another instance's segment; layer 0 first, later layers while earlier ones compute);
- computes the rest of the prompt layer by layer; as soon as a layer is computed, that layer of
  every page goes to the decode worker's reserved pages (:class:`daemons.workers.kv_sender.LayerStream`)
  and its new full blocks go to its own segment, both while the next layer computes;
- reports (TTFT) as soon as the last layer is written into decode's pages, never waiting for the
  store: puts, and the replica it keeps of pulled blocks (``replicate``: hot-block replication),
  finish in the background, and the job's pages stay taken until they have.

``stored_blocks`` in the report counts the leading blocks the worker holds or is putting in its
segment, ``replicated_blocks`` the pulled ones it is keeping. Its KV cache (one tensor, on the
model's device) is registered with the store client's transfer engine once, at start; on a GPU
the engine stages every load, put and send through pinned host memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import topology
from daemons.cluster.workdir import shm_prefix
from daemons.observe.metrics import gauge
from daemons.observe.store_metrics import client_families
from daemons.model import KVCache, ModelRunner, Sequence, reusable_blocks
from daemons.model.device import synchronize
from daemons.serving.errors import PrefixLost
from daemons.serving.messages import PrefillJob, PrefillReport, PrefillTimings
from daemons.workers.kv_sender import KvSender, LayerStream
from daemons.workers.prefill_jobs import Job, PrefillJobsDaemon
from daemons.workers.prefill_pages import PrefillPages
from daemons.workers.prefix_store import PrefixStore
from store.client import StoreClient


class PrefillWorkerDaemon(PrefillJobsDaemon):
    def setup_worker(self) -> None:
        matrix_file = self.paths.topology_file
        matrix = topology.load_matrix(matrix_file) if matrix_file.exists() else None
        self.store = StoreClient(self.master_address, self.config, topology=matrix,
                                 shm_prefix=shm_prefix(self.cluster_id),
                                 segment_size=self.config.prefill_segment_size,
                                 client_id=f"{self.name}-{self.cluster_id}-{self.started_at:.0f}")
        self.segment = self.store.owner.segment.segment_id if self.store.owner else None
        self.kv = KVCache(self.layout, device=self.model.device)
        self.kv_address = self.store.register_buffer(self.kv.transfer_buffer())
        self.pages = PrefillPages(self.layout.num_blocks, self.layout.block_size)
        self.runner = ModelRunner(self.model, self.kv)
        self.prefix = PrefixStore(self.store, self.layout, self.kv_address, self.segment)
        self.sender = KvSender(self.store.engine, self.layout, self.kv_address)
        self.start_jobs()

    def pull_store(self) -> StoreClient:
        return self.store

    def load(self) -> dict[str, Any]:
        own = {"segment": self.segment} if getattr(self, "segment", None) else {}
        return {**super().load(), **own}

    def metric_families(self) -> Iterator[Any]:
        yield from super().metric_families()
        yield gauge("mooncake_worker_kv_blocks_free", "KV pages free for the next job", self.pages.num_free_blocks)
        yield from client_families(self.store)

    def teardown(self) -> None:
        if hasattr(self, "compute"):
            self.stop_jobs()
            self.sender.close()
            self.prefix.close()
            self.store.close()
        super().teardown()

    def prefill(self, job: Job) -> PrefillReport:
        spec = job.request
        seq = Sequence.from_prompt(spec.request_id, spec.token_ids, max_tokens=1)
        self.pages.take(seq, timeout=self.config.request_timeout)
        decode = spec.decode
        stream: LayerStream | None = None
        try:
            stream = self.sender.stream(seq.block_table, decode.segment, decode.kv_address, decode.block_ids)
            try:
                return self._compute(seq, spec, stream, spec.load_blocks)
            except PrefixLost:
                # The prefix went out of the store between layers: the pages hold a mix, so
                # start over without it (the layers sent already are sent again, in order).
                # Rare: the master evicts least recently used first.
                seq.num_kv_tokens = 0
                return self._compute(seq, spec, stream, 0)
        finally:
            if stream is not None:
                stream.settle()  # no write may still read the pages once they go back
            self.prefix.when_stored(lambda: self.pages.give_back(seq))

    def _compute(self, seq: Sequence, spec: PrefillJob, stream: LayerStream, load_blocks: int) -> PrefillReport:
        size = self.layout.block_size
        keys = seq.block_keys(size, seed=self.config.block_hash_seed)
        began = time.monotonic()
        hit, loads = 0, []
        wanted = reusable_blocks(len(seq), size, load_blocks)
        local = min(spec.local_blocks, wanted)
        if wanted:
            hit, loads = self.prefix.load(keys[:wanted], seq.block_table[:wanted], local_blocks=local,
                                          source_segment=spec.source_segment)
        seq.num_kv_tokens = hit * size
        computing = time.monotonic()
        waited = 0.0  # time the layers stood still for a layer of the prefix still loading

        def layer_done(layer: int, new_blocks: list[int]) -> None:
            nonlocal waited
            stream.send_layers(layer, layer + 1)  # layer `layer` of every page is final now
            if spec.store:
                self.prefix.store_layer(layer, keys[hit:hit + len(new_blocks)], new_blocks)
            if layer + 1 < len(loads):
                paused = time.monotonic()
                loads[layer + 1].result()
                waited += time.monotonic() - paused

        try:
            logits = self.runner.prefill(seq, layer_done)
        except BaseException:
            for pending in loads[1:]:  # nothing may still move into the pages
                pending.exception()
            raise
        synchronize(self.model.device)  # on a GPU the layers may still run: compute ends here
        computed = time.monotonic()
        kv_bytes = stream.wait()
        pulled = max(0, hit - local)
        keep = bool(spec.store and spec.replicate and self.segment and pulled)
        if keep:  # after the KV went to decode: off the TTFT path
            self.prefix.keep(keys[local:hit], seq.block_table[local:hit])
        # The leading blocks this worker holds, or is putting, in its own segment (without one,
        # in the pool). Pulled blocks it does not keep end that run: the index learns prefixes.
        dropped = bool(self.segment and pulled and not keep)
        held = hit if not spec.store else (local if dropped else len(seq) // size)
        return PrefillReport(seq.seq_id, True, first_token=int(logits.argmax()), loaded_blocks=hit,
                             stored_blocks=held, kv_bytes=kv_bytes, replicated_blocks=pulled if keep else 0,
                             timings=PrefillTimings(load=computing - began + waited,
                                                    compute=computed - computing - waited,
                                                    transfer=time.monotonic() - computed))
