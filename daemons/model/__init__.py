"""The torch model the prefill and decode workers run, and its paged KV cache.

A library: workers wrap it, nothing here opens sockets or reads settings on its own. Names are
imported from their module when first used, so the conductor (tokenizers, a checkpoint's config)
never imports torch, which costs a process 1.5 s here.

    model = build_model(config)                           # on model_device; or random_model / load_checkpoint(dir)
    tokenizer = build_tokenizer(config)                   # ByteTokenizer, or HfTokenizer.from_dir(dir)
    kv = KVCache(kv_layout(config, model), device=model.device)  # one tensor; register kv.transfer_buffer() once
    pages = BlockManager(kv.layout.num_blocks, kv.layout.block_size)
    runner = ModelRunner(model, kv)
    runner.prefill(seq, on_layer_done=...)                # prefill worker
    StageRunner(StageModel(model, a, b), kv).run_chunk()  # one stage of a CPP prefill group
    ContinuousBatcher(runner, pages, stop_token_ids=...)  # decode worker: the model's stop tokens
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name -> the module of this package that defines it
    "ContinuousBatcher": "batcher",
    "TokenEvent": "batcher",
    "BlockManager": "block_manager",
    "ModelConfig": "config",
    "ChatTemplateError": "errors",
    "CheckpointError": "errors",
    "DeviceUnavailable": "errors",
    "KVCacheFull": "errors",
    "build_model": "from_settings",
    "kv_layout": "from_settings",
    "HfTokenizer": "hf_tokenizer",
    "build_tokenizer": "hf_tokenizer",
    "KVCache": "kv_cache",
    "KVCacheLayout": "kv_cache",
    "LlamaModel": "llama",
    "random_model": "llama",
    "Link": "pipeline",
    "QueueLink": "pipeline",
    "chunk_bounds": "pipeline",
    "prefill_in_threads": "pipeline",
    "run_stage": "pipeline",
    "generate_reference": "reference",
    "LayerDone": "runner",
    "ModelRunner": "runner",
    "reusable_blocks": "runner",
    "Sequence": "sequence",
    "StageModel": "stage",
    "StageRunner": "stage",
    "split_layers": "stage",
    "ByteTokenizer": "tokenizer",
    "Detokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "load_checkpoint": "weights",
    "save_checkpoint": "weights",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is a plain global
    return value
