"""Prefix KV in the Mooncake Store, one object per (block key, layer), moved layer by layer.

Object ``<32 hex digits of the block key>-<layer>`` holds one layer of one block exactly as it
lies in a worker's KV cache (K then V, ``layout.layer_block_bytes``). Per-layer objects are what
let both directions overlap the model:

- loading: layer 0 of every wanted block is read first (which also tells how many leading blocks
  the store still has: the master may have evicted some since the conductor chose), then layers
  1.. are read in order on a background thread while the prefill computes the layers below;
- storing: after a layer is computed its new full blocks are put on another thread while the next
  layer computes, and keep going after the prefill reported (nothing waits for them but the
  worker's pages, which :meth:`PrefixStore.when_stored` frees once they are done, and a later
  job of this worker that loads one of those blocks).

A worker with a segment of its own (``segment``, its instance-local cache) reads where the
conductor decided: its leading ``local_blocks`` from that segment only, the rest from
``source_segment`` (another instance's segment, through shared memory on one host or TCP across
hosts; None: any replica). It puts new blocks there first (one replica, preferred segment), and
keeps a copy there of every block it holds that another segment has already: the blocks it
pulled (:meth:`PrefixStore.keep`, hot-block replication) and the ones it recomputed although
another instance had stored them. A copy is a real store replica (the master's copy_start /
copy_end), written from the pages the worker already holds: no second read.

Bytes go straight between the registered KV cache and the store's segments (``get_into`` /
``put_from``), with no staging copy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from daemons.model import KVCacheLayout
from daemons.serving.errors import PrefixLost
from scheduler.block_hash import BlockKey, format_key
from store.client import StoreClient
from store.errors import ObjectAlreadyExists
from transfer.errors import MooncakeError

log = logging.getLogger(__name__)


def object_key(key: BlockKey, layer: int) -> str:
    return f"{format_key(key)}-{layer}"


class PrefixStore:
    def __init__(self, client: StoreClient, layout: KVCacheLayout, kv_address: int,
                 segment: str | None = None) -> None:
        """``segment``: the worker's own segment id (None: it has none; reads and puts go
        anywhere in the pool, and nothing is copied)."""
        self.client = client
        self.layout = layout
        self.kv_address = kv_address
        self.segment = segment
        # One thread each keeps loads (and stores) in layer order, so the layer the prefill waits
        # for next is always the one being moved.
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="prefix-load")
        self._storer = ThreadPoolExecutor(1, thread_name_prefix="prefix-store")
        # The last put or copy queued per block key: a job that loads a block this worker is
        # still putting (the job before it reported before its puts ended) waits for that first.
        self._pending: dict[BlockKey, Future] = {}
        self._pending_lock = threading.Lock()

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)
        self._storer.shutdown(wait=True)

    def _spans(self, layer: int, block_ids: list[int]) -> tuple[list[int], list[int]]:
        addresses = [self.kv_address + self.layout.layer_block_offset(layer, b) for b in block_ids]
        return addresses, [self.layout.layer_block_bytes] * len(block_ids)

    def load(self, keys: list[BlockKey], block_ids: list[int], layers: range | None = None, *,
             local_blocks: int | None = None, source_segment: str | None = None) -> tuple[int, list[Future | None]]:
        """Read the first of ``layers`` (default: all) of ``keys`` into ``block_ids`` now and the
        others in the background (a CPP stage loads only its own layers): the leading
        ``local_blocks`` (default: all) from the own segment, the others from ``source_segment``.

        Returns how many leading blocks were found, and per layer of ``layers`` a future to wait
        on before the layer computes (None for the first, already in place). Blocks past the
        first missing one are not used: a prefix is only reusable up to its first gap.
        """
        layers = layers or range(self.layout.num_layers)
        local = len(keys) if local_blocks is None else local_blocks
        self._wait_pending(keys)
        segments = [self.segment if i < local else source_segment for i in range(len(keys))]
        addresses, sizes = self._spans(layers[0], block_ids)
        results = self.client.batch_get_into([object_key(k, layers[0]) for k in keys], addresses, sizes, segments)
        hit = next((i for i, r in enumerate(results) if isinstance(r, MooncakeError)), len(results))
        futures: list[Future | None] = [None]
        for layer in layers[1:]:
            futures.append(self._loader.submit(self._load_layer, layer, keys[:hit], block_ids[:hit],
                                               segments[:hit]))
        return hit, futures

    def _load_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int],
                    segments: list[str | None]) -> None:
        if not keys:
            return
        addresses, sizes = self._spans(layer, block_ids)
        results = self.client.batch_get_into([object_key(k, layer) for k in keys], addresses, sizes, segments)
        lost = [k for k, r in zip(keys, results) if isinstance(r, MooncakeError)]
        if lost:
            raise PrefixLost(f"{len(lost)} prefix block(s) of layer {layer} left the store mid-load")

    def store_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int]) -> Future:
        """Put one layer of the new blocks in the background; the future yields the number of
        leading blocks now in the store (an existing object counts: another request put it, and
        with a segment of our own we copy it there from our pages)."""
        return self._queue(keys, self._store_layer, layer, keys, block_ids)

    def _store_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int]) -> int:
        if not keys:
            return 0
        names = [object_key(k, layer) for k in keys]
        addresses, sizes = self._spans(layer, block_ids)
        placement = {"preferred_segments": (self.segment,), "replicas": 1} if self.segment else {}
        results = self.client.batch_put_from(names, addresses, sizes, **placement)
        existing = [i for i, r in enumerate(results) if isinstance(r, ObjectAlreadyExists)]
        if existing and self.segment:
            copied = self.client.batch_copy_from([names[i] for i in existing], [addresses[i] for i in existing],
                                                 [sizes[i] for i in existing], self.segment)
            for i, error in zip(existing, copied):
                results[i] = error
        ok = [r is None or isinstance(r, ObjectAlreadyExists) for r in results]
        return ok.index(False) if False in ok else len(ok)

    def keep(self, keys: list[BlockKey], block_ids: list[int], layers: range | None = None) -> Future:
        """Copy ``layers`` (default: all; a CPP stage keeps its own) of blocks the worker pulled
        into its own segment, in the background, from its pages; the future yields how many
        leading blocks got a copy of every one of those layers."""
        return self._queue(keys, self._keep, keys, block_ids, layers or range(self.layout.num_layers))

    def _keep(self, keys: list[BlockKey], block_ids: list[int], layers: range) -> int:
        kept = len(keys)
        for layer in layers:
            addresses, sizes = self._spans(layer, block_ids[:kept])
            errors = self.client.batch_copy_from([object_key(k, layer) for k in keys[:kept]], addresses, sizes,
                                                 self.segment)
            kept = next((i for i, e in enumerate(errors) if e is not None), kept)
        return kept

    def when_stored(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the storing thread once every put and copy queued so far ended
        (it frees the pages they read from)."""
        self._storer.submit(callback)

    def _queue(self, keys: list[BlockKey], work: Callable[..., int], *args: Any) -> Future:
        future = self._storer.submit(work, *args)
        with self._pending_lock:
            for key in keys:
                self._pending[key] = future
        future.add_done_callback(lambda done: self._forget(keys, done))
        return future

    def _forget(self, keys: list[BlockKey], done: Future) -> None:
        with self._pending_lock:
            for key in keys:
                if self._pending.get(key) is done:
                    del self._pending[key]
        if not done.cancelled() and done.exception() is not None:
            # Nobody waits for these after the report: say why the blocks are not in the store.
            log.warning("storing %d prefix block(s) failed: %s", len(keys), done.exception())

    def _wait_pending(self, keys: list[BlockKey]) -> None:
        with self._pending_lock:
            pending = {id(f): f for f in (self._pending.get(k) for k in keys) if f is not None}
        for future in pending.values():  # the storing thread runs them in order: the last decides
            future.exception()
