"""One pipeline stage of the decoder: layers [start, stop), and the runner that prefills a chunk
of a prompt through them.

Chunked pipeline-parallel prefill (CPP) gives each worker of a prefill group a contiguous range
of layers: the first stage also embeds the tokens, the last also holds the final norm and LM
head. A stage keeps the whole model's page layout (every layer's slot in each page) but fills
only its own layers, so its pages, its per-layer store objects and its writes into a decode
worker's pages use the same byte offsets as a single worker's.
"""

from __future__ import annotations

import torch
from torch import nn

from daemons.model.kv_cache import KVCache
from daemons.model.llama import LlamaModel
from daemons.model.runner import LayerDone, prefill_layer
from daemons.model.sequence import Sequence


def split_layers(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) layer ranges, as even as possible, earlier stages one larger."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} stages")
    share, extra = divmod(num_layers, stages)
    bounds, start = [], 0
    for stage in range(stages):
        stop = start + share + (stage < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


class StageModel(nn.Module):
    """Layers [start, stop) of ``model`` (its modules, not copies): a process that keeps only
    this object lets the other layers' weights go."""

    def __init__(self, model: LlamaModel, start: int, stop: int) -> None:
        super().__init__()
        if not 0 <= start < stop <= model.config.num_layers:
            raise ValueError(f"layers [{start}, {stop}) outside a {model.config.num_layers}-layer model")
        self.config = model.config
        self.start, self.stop = start, stop
        self.embed_tokens = model.model.embed_tokens if self.is_first else None
        self.layers = nn.ModuleList(model.layers[start:stop])
        self.norm = model.model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None

    @property
    def device(self) -> torch.device:
        return self.layers[0].input_layernorm.weight.device

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.stop == self.config.num_layers

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [T, vocab] of final hidden states; the last stage only."""
        if not self.is_last:
            raise ValueError(f"stage [{self.start}, {self.stop}) has no LM head")
        return self.lm_head(self.norm(hidden)).float()


class StageRunner:
    def __init__(self, stage: StageModel, kv_cache: KVCache) -> None:
        if kv_cache.layout.num_layers != stage.config.num_layers:
            raise ValueError("KV cache layout does not match the model's layers")
        if kv_cache.device != stage.device:
            raise ValueError(f"KV pages on {kv_cache.device}, the stage's layers on {stage.device}")
        self.stage = stage
        self.kv_cache = kv_cache
        self.block_size = kv_cache.layout.block_size

    @torch.no_grad()
    def run_chunk(self, seq: Sequence, begin: int, end: int, hidden: torch.Tensor | None = None,
                  on_layer_done: LayerDone | None = None) -> torch.Tensor:
        """Tokens [begin, end) of ``seq`` through this stage's layers: their hidden states in
        (None on the first stage, which embeds the tokens), their hidden states out.

        ``begin`` is a block boundary and the KV of tokens before it is already in this stage's
        layers of ``seq``'s pages (earlier chunks, or a loaded prefix). ``on_layer_done`` gets
        each global layer index with the pages this chunk filled.
        """
        size = self.block_size
        if begin % size or not 0 <= begin < end <= len(seq):
            raise ValueError(f"chunk [{begin}, {end}) must start at a block boundary inside {len(seq)} tokens")
        if len(seq.block_table) * size < end:
            raise ValueError(f"block table of {len(seq.block_table)} pages cannot hold {end} tokens")
        if self.stage.is_first:
            hidden = self.stage.embed_tokens(torch.tensor(seq.token_ids[begin:end], device=self.kv_cache.device))
        elif hidden is None or hidden.shape[0] != end - begin:
            raise ValueError(f"stage [{self.stage.start}, {self.stage.stop}) needs {end - begin} hidden states in")
        filled = seq.block_table[begin // size:end // size]
        for offset, layer in enumerate(self.stage.layers):
            index = self.stage.start + offset
            hidden = prefill_layer(self.kv_cache, index, layer, seq.block_table, hidden, begin)
            if on_layer_done is not None:
                on_layer_done(index, filled)
        return hidden
