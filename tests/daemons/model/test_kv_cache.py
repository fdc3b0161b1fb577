"""Page bytes: layout offsets, export/import round trips, registering foreign memory; the allocator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from daemons.model import (BlockManager, KVCache, KVCacheFull, KVCacheLayout, ModelConfig, Sequence,
                           random_model)
from daemons.model.errors import CheckpointError
from transfer.errors import MooncakeError

CONFIG = ModelConfig.tiny()


def _filled(num_blocks=4, block_size=4, buffer=None):
    kv = KVCache(KVCacheLayout.for_model(CONFIG, block_size, num_blocks), buffer=buffer)
    kv.tensor.copy_(torch.randn(kv.layout.shape, generator=torch.Generator().manual_seed(3)))
    return kv


def test_offsets_address_the_block_and_layer_in_the_flat_bytes():
    kv = _filled()
    layout = kv.layout
    # 4 layers x K,V x 4 tokens x 2 KV heads x 32 dims x 4 bytes
    assert layout.layer_block_bytes == 2 * 4 * 2 * 32 * 4 and layout.block_bytes == 4 * layout.layer_block_bytes
    assert kv.numpy().nbytes == layout.nbytes == 4 * layout.block_bytes
    start = layout.layer_block_offset(layer=2, block_id=3)
    expected = kv.tensor[3, 2].contiguous().view(torch.uint8).numpy().reshape(-1)
    assert np.array_equal(kv.numpy()[start:start + layout.layer_block_bytes], expected)
    assert kv.export_block(3, layer=2) == expected.tobytes()
    assert kv.export_block(3) == b"".join(kv.export_block(3, layer) for layer in range(4))
    with pytest.raises(IndexError):
        layout.block_offset(4)


def test_export_import_round_trip_is_bitwise_whole_block_and_per_layer():
    source, target = _filled(), KVCache(KVCacheLayout.for_model(CONFIG, 4, 4))
    target.import_block(0, source.export_block(2))
    assert torch.equal(target.tensor[0], source.tensor[2])
    for layer in range(4):
        target.import_block(1, memoryview(source.export_block(3, layer)), layer=layer)
    assert torch.equal(target.tensor[1], source.tensor[3])
    assert target.export_block(1) == source.export_block(3)
    with pytest.raises(ValueError):
        target.import_block(0, b"short")


def test_cache_lives_in_a_given_buffer_as_for_a_registered_shared_region():
    layout = KVCacheLayout.for_model(CONFIG, 4, 2)
    buffer = np.zeros(layout.nbytes + 100, dtype=np.uint8)
    kv = _filled(num_blocks=2, buffer=buffer)
    assert np.shares_memory(kv.numpy(), buffer)
    assert buffer[:layout.block_bytes].tobytes() == kv.export_block(0)
    with pytest.raises(ValueError):
        KVCache(layout, buffer=np.zeros(layout.nbytes - 1, dtype=np.uint8))


def test_kv_cache_size_decides_the_number_of_pages():
    layout = KVCacheLayout.for_memory(CONFIG, block_size=16, nbytes=10 * 32768 + 5)
    # 4 layers x K,V x 16 tokens x 2 KV heads x 32 dims x 4 bytes
    assert layout.block_bytes == 32768 and layout.num_blocks == 10
    bf16 = KVCacheLayout.for_model(ModelConfig.tiny(dtype="bfloat16"), 16, 1)
    assert bf16.block_bytes == 32768 // 2
    assert random_model(ModelConfig.tiny(dtype="bfloat16")).lm_head.weight.dtype == torch.bfloat16


def test_allocator_hands_out_pages_in_order_and_exhaustion_is_typed():
    pages = BlockManager(num_blocks=4, block_size=16)
    a = Sequence.from_prompt("a", list(range(33)), max_tokens=4)
    assert pages.can_allocate(a) and pages.allocate(a) == [0, 1, 2]
    assert pages.allocate(a) == []  # already covered
    b = Sequence.from_prompt("b", list(range(20)), max_tokens=4)
    assert not pages.can_allocate(b)
    with pytest.raises(KVCacheFull) as caught:
        pages.allocate(b)
    assert isinstance(caught.value, MooncakeError) and caught.value.code == -1090
    assert (caught.value.needed, caught.value.free) == (2, 1)
    assert b.block_table == [] and pages.num_free_blocks == 1  # nothing taken on failure
    assert pages.allocate(b, num_tokens=16) == [3]
    pages.deallocate(a)
    assert pages.num_free_blocks == 3 and a.block_table == [] and a.num_kv_tokens == 0
    assert pages.allocate(b, num_tokens=64) == [0, 1, 2]  # reserve a request's whole life
    assert CheckpointError.code == -1091
