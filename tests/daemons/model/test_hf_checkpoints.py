"""Checkpoints made by transformers, run here: logits and greedy tokens equal transformers' own,
through paged prefill with a prefix loaded as the store hands it over, decode, and CPP stages."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from daemons.model import (BlockManager, CheckpointError, ContinuousBatcher, HfTokenizer, KVCache, KVCacheLayout,
                           ModelConfig, ModelRunner, Sequence, StageModel, StageRunner, load_checkpoint,
                           prefill_in_threads, reusable_blocks, split_layers)
from tests.daemons.model.conftest import BLOCK
from tests.daemons.model.hf_checkpoints import (KINDS, load_reference, make_checkpoint, reference_greedy,
                                                reference_logits, set_stop_tokens)

TEXT = "Hello, world! The quick brown fox jumps over the lazy dog. Prefill computes the prompt: 世界, ça va?"
PROMPT_TOKENS = 2 * BLOCK + 9  # two whole blocks to load from the store, and a tail to compute
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: make_checkpoint(root, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def references(checkpoints):
    return {kind: load_reference(directory) for kind, directory in checkpoints.items()}


@pytest.fixture(scope="module")
def models(checkpoints):
    return {kind: load_checkpoint(directory) for kind, directory in checkpoints.items()}


def _prompt(directory) -> list[int]:
    tokens = HfTokenizer.from_dir(directory).encode(TEXT)
    assert len(tokens) >= PROMPT_TOKENS
    return tokens[:PROMPT_TOKENS]


def _worker(model, num_blocks=16):
    kv = KVCache(KVCacheLayout.for_model(model.config, BLOCK, num_blocks))
    return ModelRunner(model, kv), BlockManager(num_blocks, BLOCK)


def _decode(runner, pages, seq, first_logits):
    """Decode ``seq`` (KV of every prompt token in its pages) to the end as a decode worker does."""
    stops = runner.model.config.stop_token_ids
    seq.append(int(first_logits.argmax()), stops)
    batcher = ContinuousBatcher(runner, pages, stop_token_ids=stops)
    if not seq.is_finished:
        batcher.add(seq)
    while batcher.num_active:
        batcher.step()
    return seq.generated


def _greedy_with_loaded_prefix(model, tokens, max_tokens):
    """A cold worker prefills and stores its blocks; a second worker loads the prefix blocks
    from those bytes into pages of its own, computes the rest and decodes."""
    cold_runner, cold_pages = _worker(model)
    cold = Sequence.from_prompt("cold", tokens, max_tokens)
    cold_pages.allocate(cold)
    cold_runner.prefill(cold)
    stored = [cold_runner.kv_cache.export_block(block) for block in cold.block_table]

    runner, pages = _worker(model)
    pages.allocate(Sequence.from_prompt("other", tokens[:20], max_tokens=1))  # pages in another order
    seq = Sequence.from_prompt("warm", tokens, max_tokens)
    pages.allocate(seq, len(tokens) + max_tokens)
    hit = reusable_blocks(len(tokens), BLOCK, hit_blocks=len(tokens) // BLOCK)
    assert hit == 2
    for i in range(hit):
        runner.kv_cache.import_block(seq.block_table[i], stored[i])
    seq.num_kv_tokens = hit * BLOCK
    return _decode(runner, pages, seq, runner.prefill(seq))


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_logits_equal_transformers_forward(kind, checkpoints, references, models):
    model, tokens = models[kind], _prompt(checkpoints[kind])
    expected = reference_logits(references[kind], tokens)
    assert torch.allclose(model.forward_dense(tokens), expected, rtol=0, atol=1e-4)
    runner, pages = _worker(model)
    seq = Sequence.from_prompt(kind, tokens, max_tokens=1)
    pages.allocate(seq)
    assert torch.allclose(runner.prefill(seq), expected[-1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_with_a_prefix_loaded_from_the_store_equal_generate(kind, checkpoints, references, models):
    tokens = _prompt(checkpoints[kind])
    assert _greedy_with_loaded_prefix(models[kind], tokens, MAX_TOKENS) == \
        reference_greedy(references[kind], tokens, MAX_TOKENS)


@pytest.mark.parametrize("kind", KINDS)
def test_cpp_stages_then_decode_equal_generate(kind, checkpoints, references, models):
    model, tokens = models[kind], _prompt(checkpoints[kind])
    runners, seqs = [], []
    for k, (start, stop) in enumerate(split_layers(model.config.num_layers, 2)):
        kv = KVCache(KVCacheLayout.for_model(model.config, BLOCK, 8))
        seq = Sequence.from_prompt(k, tokens, max_tokens=1)
        BlockManager(8, BLOCK).allocate(seq)
        runners.append(StageRunner(StageModel(model, start, stop), kv))
        seqs.append(seq)
    logits = prefill_in_threads(runners, seqs, chunk=BLOCK)
    # The stages' layers of each page, assembled in one decode worker's pages.
    runner, pages = _worker(model)
    seq = Sequence.from_prompt("decode", tokens, MAX_TOKENS)
    pages.allocate(seq, len(tokens) + MAX_TOKENS)
    for stage, stage_seq in zip(runners, seqs):
        for layer in range(stage.stage.start, stage.stage.stop):
            for mine, theirs in zip(stage_seq.block_table, seq.block_table):
                runner.kv_cache.import_block(theirs, stage.kv_cache.export_block(mine, layer), layer)
    seq.num_kv_tokens = len(tokens)
    assert _decode(runner, pages, seq, logits) == reference_greedy(references[kind], tokens, MAX_TOKENS)


def test_each_architecture_loads_what_makes_it_differ(checkpoints, models):
    llama3, linear = models["llama3"].config, models["llama_linear"].config
    assert (llama3.rope.kind, llama3.rope.theta, llama3.rope.original_max_position_embeddings) == ("llama3", 5e5, 64)
    assert (linear.rope.kind, linear.rope.theta, linear.rope.factor) == ("linear", 2e4, 2.0)  # old spelling
    assert linear.qkv_bias and linear.o_proj_bias and linear.mlp_bias
    qwen2, qwen3 = models["qwen2"], models["qwen3"]
    assert qwen2.config.qkv_bias and not qwen2.config.o_proj_bias
    assert qwen2.lm_head.weight is qwen2.model.embed_tokens.weight
    assert qwen3.config.qk_norm and qwen3.config.head_dim == 32 != qwen3.config.hidden_size // qwen3.config.num_heads
    shards = sorted(p.name for p in checkpoints["mistral"].glob("*.safetensors"))
    assert len(shards) > 1 and (checkpoints["mistral"] / "model.safetensors.index.json").exists()


def test_generation_stops_at_any_stop_token(checkpoints, references, models, tmp_path):
    """A stop token other than EOS, from generation_config.json, ends the generation here as it
    does in transformers."""
    tokens = _prompt(checkpoints["llama3"])
    free_run = reference_greedy(references["llama3"], tokens, MAX_TOKENS)
    assert len(free_run) == MAX_TOKENS
    stop = free_run[4]
    directory = shutil.copytree(checkpoints["llama3"], tmp_path / "llama3")
    eos = models["llama3"].config.eos_token_id
    set_stop_tokens(directory, [eos, stop])
    model = load_checkpoint(directory)
    assert model.config.stop_token_ids == {eos, stop}
    assert HfTokenizer.from_dir(directory).stop_token_ids >= {eos, stop}
    expected = reference_greedy(load_reference(directory), tokens, MAX_TOKENS)
    assert expected == free_run[:free_run.index(stop) + 1] and len(expected) < MAX_TOKENS
    assert _greedy_with_loaded_prefix(model, tokens, MAX_TOKENS) == expected


def test_bfloat16_checkpoint_loads_and_runs_in_bfloat16(tmp_path):
    directory = make_checkpoint(tmp_path, "qwen3", dtype=torch.bfloat16)
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"
    model = load_checkpoint(directory)
    assert model.config.dtype == "bfloat16"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    tokens = _prompt(directory)
    runner, pages = _worker(model)
    assert runner.kv_cache.tensor.dtype == torch.bfloat16
    seq = Sequence.from_prompt("bf16", tokens, max_tokens=1)
    pages.allocate(seq)
    logits = runner.prefill(seq)
    expected = reference_logits(load_reference(directory, torch.bfloat16), tokens)[-1]
    # bfloat16 keeps 8 bits of mantissa: the two implementations round at different points.
    assert torch.allclose(logits, expected, rtol=0, atol=0.1)
    assert int(logits.argmax()) == int(expected.argmax())
    assert load_checkpoint(directory, dtype="float32").lm_head.weight.dtype == torch.float32


def _llama3_config(checkpoints) -> dict:
    return json.loads((checkpoints["llama3"] / "config.json").read_text())


REFUSED = {
    "another model type": ({"model_type": "gpt2"}, "gpt2"),
    "yarn": ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
    "dynamic": ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "dynamic"),
    "dynamic, old spelling": ({"rope_parameters": None, "rope_theta": 1e4,
                               "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
    "partial rotary": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act"),
    "quantized": ({"quantization_config": {"quant_method": "gptq"}}, "quantized"),
    "mistral window": ({"model_type": "mistral", "sliding_window": 128}, "sliding window of 128"),
    "qwen2 window": ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 64,
                      "max_window_layers": 1}, "sliding window of 64"),
}


@pytest.mark.parametrize("change", REFUSED.values(), ids=REFUSED.keys())
def test_configs_that_change_the_math_unimplemented_here_are_refused_in_one_line(change, checkpoints):
    fields, reason = change
    with pytest.raises(CheckpointError, match=reason) as caught:
        ModelConfig.from_hf({**_llama3_config(checkpoints), **fields})
    assert "\n" not in str(caught.value)


def test_sliding_windows_that_never_slide_are_accepted(checkpoints):
    hf = _llama3_config(checkpoints)
    assert ModelConfig.from_hf({**hf, "model_type": "mistral", "sliding_window": 256}).architecture == "mistral"
    # Qwen's sliding_window is read only when use_sliding_window is set.
    assert ModelConfig.from_hf({**hf, "model_type": "qwen2", "sliding_window": 64}).architecture == "qwen2"


def test_a_missing_shard_is_a_typed_error(checkpoints, tmp_path):
    directory = shutil.copytree(checkpoints["mistral"], tmp_path / "mistral")
    next(directory.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="not there"):
        load_checkpoint(directory)


def test_our_config_round_trips_through_config_json(models):
    for model in models.values():
        assert ModelConfig.from_hf(model.config.to_hf()) == model.config
