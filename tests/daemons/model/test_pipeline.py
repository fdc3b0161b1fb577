"""Chunked pipeline-parallel prefill in one process (a thread per stage) against one worker:
the same final hidden states, the same KV bits layer by layer, the same greedy tokens."""

from __future__ import annotations

import pytest
import torch

from daemons.model import (BlockManager, ContinuousBatcher, KVCache, KVCacheLayout, ModelRunner, Sequence,
                           StageModel, StageRunner, chunk_bounds, generate_reference, prefill_in_threads,
                           split_layers)
from tests.daemons.model.conftest import BLOCK, prompt

CHUNK = 2 * BLOCK


def _cache(model, num_blocks=16):
    return KVCache(KVCacheLayout.for_model(model.config, BLOCK, num_blocks))


def _single_worker(model, tokens):
    kv = _cache(model)
    seq = Sequence.from_prompt("one", tokens, max_tokens=1)
    BlockManager(kv.layout.num_blocks, BLOCK).allocate(seq)
    logits = ModelRunner(model, kv).prefill(seq)
    return kv, seq, logits


def _group(model, stages, tokens, chunk=CHUNK, seen=None):
    """Stage runners over fresh caches, the prompt prefilled through them; (runners, seqs, logits)."""
    runners, seqs = [], []
    for k, (start, stop) in enumerate(split_layers(model.config.num_layers, stages)):
        kv = _cache(model)
        seq = Sequence.from_prompt(k, tokens, max_tokens=1)
        BlockManager(kv.layout.num_blocks, BLOCK).allocate(seq)
        runners.append(StageRunner(StageModel(model, start, stop), kv))
        seqs.append(seq)
    record = None if seen is None else (lambda layer, pages: seen.append((layer, len(pages))))
    return runners, seqs, prefill_in_threads(runners, seqs, chunk, record)


def test_split_layers_and_chunk_bounds():
    assert split_layers(4, 2) == [(0, 2), (2, 4)]
    assert split_layers(5, 3) == [(0, 2), (2, 4), (4, 5)]
    with pytest.raises(ValueError):
        split_layers(2, 3)
    # A chunk is rounded up to whole blocks, so every chunk after the first starts on a boundary.
    assert chunk_bounds(0, 70, 20, BLOCK) == [(0, 32), (32, 64), (64, 70)]
    assert chunk_bounds(32, 64, 32, BLOCK) == [(32, 64)]


def test_stage_model_holds_only_its_layers(model):
    first, last = StageModel(model, 0, 2), StageModel(model, 2, 4)
    assert first.embed_tokens is not None and first.lm_head is None and len(first.layers) == 2
    assert last.embed_tokens is None and last.layers[0] is model.layers[2]
    with pytest.raises(ValueError):
        first.logits(torch.zeros(1, model.config.hidden_size))


@pytest.mark.parametrize("length", [CHUNK - 5, 3 * CHUNK, 3 * CHUNK + 7])
@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_equals_single_worker(model, length, stages):
    """Shorter than a chunk, an exact multiple of it, and longer with a partial tail."""
    tokens = prompt(length, seed=length)
    kv, seq, logits = _single_worker(model, tokens)
    seen = []
    runners, seqs, piped = _group(model, stages, tokens, seen=seen)
    assert torch.equal(piped, logits)
    # Every stage's layers of every page hold exactly the one-worker KV.
    for runner, stage_seq in zip(runners, seqs):
        for layer in range(runner.stage.start, runner.stage.stop):
            for mine, theirs in zip(stage_seq.block_table, seq.block_table):
                assert runner.kv_cache.export_block(mine, layer) == kv.export_block(theirs, layer)
        assert stage_seq.num_kv_tokens == length
    # Each (layer, chunk) reported the full pages that chunk filled: all full blocks once per layer.
    per_layer = {layer: sum(n for at, n in seen if at == layer) for layer, _ in seen}
    assert per_layer == {layer: length // BLOCK for layer in range(model.config.num_layers)}


def test_final_hidden_states_equal_single_stage(model):
    tokens = prompt(3 * CHUNK + 3, seed=3)
    whole = StageRunner(StageModel(model, 0, model.config.num_layers), _cache(model))
    one = Sequence.from_prompt("one", tokens, max_tokens=1)
    BlockManager(16, BLOCK).allocate(one)
    expected = whole.run_chunk(one, 0, len(tokens))
    runners, seqs, _ = _group(model, 2, tokens)
    # Rerun the chunks on fresh stages, this time keeping the last stage's outputs.
    hidden = []
    first, last = runners
    for s in seqs:
        s.num_kv_tokens = 0
    for begin, end in chunk_bounds(0, len(tokens), CHUNK, BLOCK):
        hidden.append(last.run_chunk(seqs[1], begin, end, first.run_chunk(seqs[0], begin, end)))
    assert torch.equal(torch.cat(hidden), expected)


def test_pipelined_prefill_then_decode_generates_reference_tokens(model):
    """The stages' layers assembled into one decode worker's pages decode the reference tokens."""
    tokens = prompt(2 * CHUNK + 9, seed=11)
    runners, seqs, logits = _group(model, 2, tokens)
    kv = _cache(model)
    pages = BlockManager(kv.layout.num_blocks, BLOCK)
    seq = Sequence.from_prompt("decode", tokens, max_tokens=6)
    pages.allocate(seq, len(tokens) + 6)
    for runner, stage_seq in zip(runners, seqs):
        for layer in range(runner.stage.start, runner.stage.stop):
            for mine, theirs in zip(stage_seq.block_table, seq.block_table):
                kv.import_block(theirs, runner.kv_cache.export_block(mine, layer), layer)
    seq.num_kv_tokens = len(tokens)
    seq.append(int(logits.argmax()), model.config.stop_token_ids)
    batcher = ContinuousBatcher(ModelRunner(model, kv), pages, stop_token_ids=model.config.stop_token_ids)
    batcher.add(seq)
    while not seq.is_finished:
        batcher.step()
    assert seq.generated == generate_reference(model, tokens, 6)
