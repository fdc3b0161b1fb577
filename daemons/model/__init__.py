"""The torch model the prefill and decode workers run, and its paged KV cache.

A library: workers wrap it, nothing here opens sockets or reads settings on its own.

    model = build_model(config)                           # on model_device; or random_model / load_checkpoint(dir)
    tokenizer = build_tokenizer(config)                   # ByteTokenizer, or HfTokenizer.from_dir(dir)
    kv = KVCache(kv_layout(config, model), device=model.device)  # one tensor; register kv.transfer_buffer() once
    pages = BlockManager(kv.layout.num_blocks, kv.layout.block_size)
    runner = ModelRunner(model, kv)
    runner.prefill(seq, on_layer_done=...)                # prefill worker
    StageRunner(StageModel(model, a, b), kv).run_chunk()  # one stage of a CPP prefill group
    ContinuousBatcher(runner, pages, stop_token_ids=...)  # decode worker: the model's stop tokens
"""

from daemons.model.batcher import ContinuousBatcher, TokenEvent
from daemons.model.block_manager import BlockManager
from daemons.model.config import ModelConfig
from daemons.model.errors import ChatTemplateError, CheckpointError, DeviceUnavailable, KVCacheFull
from daemons.model.from_settings import build_model, build_tokenizer, kv_layout
from daemons.model.hf_tokenizer import HfTokenizer
from daemons.model.kv_cache import KVCache, KVCacheLayout
from daemons.model.llama import LlamaModel, random_model
from daemons.model.pipeline import Link, QueueLink, chunk_bounds, prefill_in_threads, run_stage
from daemons.model.reference import generate_reference
from daemons.model.runner import LayerDone, ModelRunner, reusable_blocks
from daemons.model.sequence import Sequence
from daemons.model.stage import StageModel, StageRunner, split_layers
from daemons.model.tokenizer import ByteTokenizer, Detokenizer, Tokenizer
from daemons.model.weights import load_checkpoint, save_checkpoint

__all__ = [
    "BlockManager", "ByteTokenizer", "ChatTemplateError", "CheckpointError", "ContinuousBatcher", "Detokenizer",
    "DeviceUnavailable", "HfTokenizer", "KVCache", "KVCacheFull", "KVCacheLayout", "LayerDone", "Link", "LlamaModel", "ModelConfig",
    "ModelRunner", "QueueLink", "Sequence", "StageModel", "StageRunner", "TokenEvent", "Tokenizer", "build_model",
    "build_tokenizer", "chunk_bounds", "generate_reference", "kv_layout", "load_checkpoint", "prefill_in_threads",
    "random_model", "reusable_blocks", "run_stage", "save_checkpoint", "split_layers",
]
