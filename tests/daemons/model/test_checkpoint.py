"""Saving the tiny model as a Hugging Face Llama checkpoint and loading it back; the settings path."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from daemons.model import (ByteTokenizer, CheckpointError, ModelConfig, build_model, build_tokenizer,
                           kv_layout, load_checkpoint, random_model, save_checkpoint)
from tests.daemons.model.conftest import prompt
from transfer.settings import resolve


def test_safetensors_round_trip_keeps_every_weight_and_the_logits(model, tmp_path):
    save_checkpoint(model, tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.3.self_attn.k_proj.weight" in names and "lm_head.weight" in names
    assert json.loads((tmp_path / "config.json").read_text())["num_key_value_heads"] == 2
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    tokens = prompt(20, seed=5)
    assert torch.equal(loaded.forward_dense(tokens), model.forward_dense(tokens))


def test_tied_embeddings_and_dtype_override(tmp_path):
    tied = random_model(ModelConfig(tie_word_embeddings=True, num_layers=1), seed=4)
    save_checkpoint(tied, tmp_path)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path, dtype="bfloat16")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert loaded.lm_head.weight.dtype == torch.bfloat16


def test_bad_checkpoints_are_typed_errors(model, tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)
    save_checkpoint(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5}))
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="gpt2"):
        load_checkpoint(tmp_path)


def test_settings_build_the_tiny_model_or_load_model_dir(model, tmp_path):
    defaults = resolve(environ={})
    built = build_model(defaults)
    assert torch.equal(built.lm_head.weight, model.lm_head.weight)  # same seed, same weights
    assert isinstance(build_tokenizer(defaults), ByteTokenizer)
    assert kv_layout(defaults, built).block_size == defaults.kv_block_tokens
    save_checkpoint(model, tmp_path)
    from_dir = resolve(environ={"MOONCAKE_MODEL_DIR": str(tmp_path), "MOONCAKE_MODEL_DTYPE": "float16"})
    assert build_model(from_dir).lm_head.weight.dtype == torch.float16
    assert build_tokenizer(from_dir) is None


def test_byte_tokenizer_round_trips_any_text():
    tok = ByteTokenizer()
    ids = tok.encode("héllo, 世界")
    assert ids[0] == tok.bos_token_id and max(ids[1:]) < 256
    assert tok.decode(ids + [tok.eos_token_id]) == "héllo, 世界"
