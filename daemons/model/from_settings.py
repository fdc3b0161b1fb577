"""The model and KV cache layout a worker builds from the settings registry."""

from __future__ import annotations

from typing import Any

from daemons.model.config import ModelConfig
from daemons.model.device import model_device
from daemons.model.kv_cache import KVCacheLayout
from daemons.model.llama import LlamaModel, random_model
from daemons.model.weights import load_checkpoint


def build_model(config: Any) -> LlamaModel:
    """``config.model_dir``'s checkpoint, or the tiny random model the model_* settings describe,
    on ``config.model_device`` (DeviceUnavailable before any weight is read if the host lacks it).

    Weights are made on the CPU and then moved: the random model's are drawn from a CPU
    generator, so every device gets the same ones."""
    device = model_device(config.model_device)
    dtype = None if config.model_dtype == "auto" else config.model_dtype
    if config.model_dir:
        return load_checkpoint(config.model_dir, dtype).to(device)
    tiny = ModelConfig.tiny(layers=config.model_layers, hidden_size=config.model_hidden_size,
                            heads=config.model_heads, kv_heads=config.model_kv_heads,
                            dtype=dtype or "float32")
    return random_model(tiny, config.model_seed).to(device)


def kv_layout(config: Any, model: LlamaModel) -> KVCacheLayout:
    """Pages of ``kv_block_tokens`` tokens filling ``kv_cache_size`` bytes."""
    return KVCacheLayout.for_memory(model.config, config.kv_block_tokens, config.kv_cache_size)
