"""The call sequence of vLLM's MooncakeStoreConnector worker (vllm/.../mooncake/store/worker.py),
replayed on torch KV caches: one writer saves blocks, another process-local reader with its own
caches loads them back, and the bytes must match."""

from __future__ import annotations

import torch

from mooncake.store import ReplicateConfig
from tests.compat.conftest import make_store

LAYERS, BLOCKS, BLOCK_BYTES = 4, 8, 2048


def kv_caches(seed: int) -> dict[str, torch.Tensor]:
    """Per layer one K and one V tensor of [blocks, block bytes], as vLLM registers them."""
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}.{kv}": torch.randint(0, 255, (BLOCKS, BLOCK_BYTES), dtype=torch.uint8, generator=generator)
            for i in range(LAYERS) for kv in "kv"}


def block_ranges(caches: dict[str, torch.Tensor], block: int) -> tuple[list[int], list[int]]:
    """The block's slice of every layer's K and V: one key, many buffers."""
    addresses = [t.data_ptr() + block * BLOCK_BYTES for t in caches.values()]
    return addresses, [BLOCK_BYTES] * len(addresses)


def test_save_then_load_blocks_through_multi_buffer_calls(master):
    writer, reader = make_store(master, segment="32MB"), make_store(master, segment="32MB")
    saved, loaded = kv_caches(1), {name: torch.zeros_like(t) for name, t in kv_caches(1).items()}
    try:
        for store, caches in ((writer, saved), (reader, loaded)):  # register_kv_caches
            for tensor in caches.values():
                assert store.register_buffer(tensor.data_ptr(), tensor.numel() * tensor.element_size()) == 0
        keys = [f"model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{block:064x}" for block in range(BLOCKS)]

        # Save: dedup with batch_is_exist, then store the missing blocks.
        assert writer.batch_put_from_multi_buffers(keys[:2], *zip(*[block_ranges(saved, b) for b in range(2)])) == [0, 0]
        exists = writer.batch_is_exist(keys)
        assert exists == [1, 1] + [0] * (BLOCKS - 2)
        missing = [b for b, present in enumerate(exists) if present != 1]
        config = ReplicateConfig()
        config.preferred_segment = writer.get_hostname()
        addresses, sizes = zip(*[block_ranges(saved, b) for b in missing])
        assert writer.batch_put_from_multi_buffers([keys[b] for b in missing], list(addresses), list(sizes), config) == [0] * len(missing)

        # Load: the scheduler's lookup (longest prefix present), then every block into the reader's caches.
        present = reader.batch_is_exist(keys)
        assert present == [1] * BLOCKS
        addresses, sizes = zip(*[block_ranges(loaded, b) for b in range(BLOCKS)])
        read = reader.batch_get_into_multi_buffers(keys, list(addresses), list(sizes))
        assert read == [LAYERS * 2 * BLOCK_BYTES] * BLOCKS
        for name in saved:
            assert torch.equal(saved[name], loaded[name]), name
        assert writer.remove_all(force=True) >= BLOCKS
    finally:
        writer.close()
        reader.close()
