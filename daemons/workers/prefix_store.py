"""Prefix KV in the Mooncake Store, one object per (block key, layer), moved layer by layer.

Object ``<32 hex digits of the block key>-<layer>`` holds one layer of one block exactly as it
lies in a worker's KV cache (K then V, ``layout.layer_block_bytes``). Per-layer objects are what
let both directions overlap the model:

- loading: layer 0 of every wanted block is read first (which also tells how many leading blocks
  the store still has: the master may have evicted some since the conductor chose), then layers
  1.. are read in order on a background thread while the prefill computes the layers below;
- storing: after a layer is computed its new full blocks are put on another thread while the next
  layer computes.

Bytes go straight between the registered KV cache and the store's segments (``get_into`` /
``put_from``), with no staging copy.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from daemons.model import KVCacheLayout
from daemons.serving.errors import PrefixLost
from scheduler.block_hash import BlockKey, format_key
from store.client import StoreClient
from store.errors import ObjectAlreadyExists
from transfer.errors import MooncakeError


def object_key(key: BlockKey, layer: int) -> str:
    return f"{format_key(key)}-{layer}"


class PrefixStore:
    def __init__(self, client: StoreClient, layout: KVCacheLayout, kv_address: int) -> None:
        self.client = client
        self.layout = layout
        self.kv_address = kv_address
        # One thread each keeps loads (and stores) in layer order, so the layer the prefill waits
        # for next is always the one being moved.
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="prefix-load")
        self._storer = ThreadPoolExecutor(1, thread_name_prefix="prefix-store")

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)
        self._storer.shutdown(wait=True)

    def _spans(self, layer: int, block_ids: list[int]) -> tuple[list[int], list[int]]:
        addresses = [self.kv_address + self.layout.layer_block_offset(layer, b) for b in block_ids]
        return addresses, [self.layout.layer_block_bytes] * len(block_ids)

    def load(self, keys: list[BlockKey], block_ids: list[int],
             layers: range | None = None) -> tuple[int, list[Future | None]]:
        """Read the first of ``layers`` (default: all) of ``keys`` into ``block_ids`` now and the
        others in the background (a CPP stage loads only its own layers).

        Returns how many leading blocks were found, and per layer of ``layers`` a future to wait
        on before the layer computes (None for the first, already in place). Blocks past the
        first missing one are not used: a prefix is only reusable up to its first gap.
        """
        layers = layers or range(self.layout.num_layers)
        addresses, sizes = self._spans(layers[0], block_ids)
        results = self.client.batch_get_into([object_key(k, layers[0]) for k in keys], addresses, sizes)
        hit = next((i for i, r in enumerate(results) if isinstance(r, MooncakeError)), len(results))
        futures: list[Future | None] = [None]
        for layer in layers[1:]:
            futures.append(self._loader.submit(self._load_layer, layer, keys[:hit], block_ids[:hit]))
        return hit, futures

    def _load_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int]) -> None:
        if not keys:
            return
        addresses, sizes = self._spans(layer, block_ids)
        results = self.client.batch_get_into([object_key(k, layer) for k in keys], addresses, sizes)
        lost = [k for k, r in zip(keys, results) if isinstance(r, MooncakeError)]
        if lost:
            raise PrefixLost(f"{len(lost)} prefix block(s) of layer {layer} left the store mid-load")

    def store_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int]) -> Future:
        """Put one layer of the new blocks in the background; the future yields the number of
        leading blocks now in the store (an existing object counts: another request put it)."""
        return self._storer.submit(self._store_layer, layer, keys, block_ids)

    def _store_layer(self, layer: int, keys: list[BlockKey], block_ids: list[int]) -> int:
        if not keys:
            return 0
        addresses, sizes = self._spans(layer, block_ids)
        results = self.client.batch_put_from([object_key(k, layer) for k in keys], addresses, sizes)
        ok = [r is None or isinstance(r, ObjectAlreadyExists) for r in results]
        return ok.index(False) if False in ok else len(ok)
