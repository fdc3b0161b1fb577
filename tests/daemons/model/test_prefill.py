"""Prefill over pages against the dense reference, and prefix reuse from exported block bytes."""

from __future__ import annotations

import pytest
import torch

from daemons.model import (BlockManager, ContinuousBatcher, KVCache, KVCacheLayout, ModelRunner,
                           Sequence, generate_reference, reusable_blocks)
from scheduler.block_hash import prefix_block_keys
from tests.daemons.model.conftest import BLOCK, prompt


def _worker(model, num_blocks=32):
    kv = KVCache(KVCacheLayout.for_model(model.config, BLOCK, num_blocks))
    return ModelRunner(model, kv), BlockManager(num_blocks, BLOCK)


def test_paged_prefill_matches_dense_logits_and_kv(model):
    runner, pages = _worker(model)
    for length in (1, 15, 16, 17, 50):
        tokens = prompt(length, seed=length)
        seq = Sequence.from_prompt(length, tokens, max_tokens=1)
        pages.allocate(seq)
        logits = runner.prefill(seq)
        dense = model.forward_dense(tokens)
        assert torch.allclose(logits, dense[-1], rtol=1e-5, atol=1e-5)
        assert seq.num_kv_tokens == length
        pages.deallocate(seq)


def test_prefix_loaded_from_bytes_gives_bitwise_kv_and_same_tokens(model):
    tokens = prompt(16 * 3 + 5, seed=7)  # three full blocks and a five-token tail
    cold_runner, cold_pages = _worker(model)
    cold = Sequence.from_prompt("cold", tokens, max_tokens=6)
    cold_pages.allocate(cold)
    layers_seen = []
    cold_logits = cold_runner.prefill(cold, lambda layer, blocks: layers_seen.append((layer, blocks)))
    # Every layer reports the same three new full blocks; the tail block has no key, so no store.
    assert layers_seen == [(layer, cold.block_table[:3]) for layer in range(model.config.num_layers)]
    stored = [cold_runner.kv_cache.export_block(b) for b in cold.block_table[:3]]
    keys = cold.block_keys(BLOCK)
    assert len(keys) == 3 and keys == prefix_block_keys(tokens, BLOCK)

    # A second worker with its pages in another order loads two blocks and computes the rest.
    warm_runner, warm_pages = _worker(model)
    warm_pages.allocate(Sequence.from_prompt("other", prompt(40, seed=1), max_tokens=1))
    warm = Sequence.from_prompt("warm", tokens, max_tokens=6)
    warm_pages.allocate(warm)
    assert warm.block_table != cold.block_table
    hit = reusable_blocks(len(tokens), BLOCK, hit_blocks=2)
    for i in range(hit):
        warm_runner.kv_cache.import_block(warm.block_table[i], stored[i])
    warm.num_kv_tokens = hit * BLOCK
    new_blocks = []
    warm_logits = warm_runner.prefill(warm, lambda layer, blocks: new_blocks.append(blocks))
    assert new_blocks[0] == [warm.block_table[2]]
    assert warm_runner.kv_cache.export_block(warm.block_table[2]) == stored[2]
    # The tail's five tokens too, in every layer (the rest of its page is unwritten).
    assert torch.equal(warm_runner.kv_cache.tensor[warm.block_table[3], :, :, :5],
                       cold_runner.kv_cache.tensor[cold.block_table[3], :, :, :5])
    assert torch.equal(warm_logits, cold_logits)
    # Decoding on from the reused prefix continues exactly as the one-process reference.
    stop = model.config.stop_token_ids
    warm.append(int(warm_logits.argmax()), stop)
    batcher = ContinuousBatcher(warm_runner, warm_pages, stop_token_ids=stop)
    batcher.add(warm)
    while batcher.num_active:
        batcher.step()
    assert warm.generated == generate_reference(model, tokens, 6)


def test_whole_prompt_cached_still_computes_the_last_block(model):
    assert reusable_blocks(num_prompt_tokens=48, block_size=16, hit_blocks=3) == 2
    assert reusable_blocks(num_prompt_tokens=49, block_size=16, hit_blocks=3) == 3
    assert reusable_blocks(num_prompt_tokens=10, block_size=16, hit_blocks=5) == 0


def test_prefill_refuses_a_start_inside_a_block(model):
    runner, pages = _worker(model)
    seq = Sequence.from_prompt(1, prompt(40, seed=2), max_tokens=1)
    pages.allocate(seq)
    seq.num_kv_tokens = 5
    with pytest.raises(ValueError, match="block boundary"):
        runner.prefill(seq)
