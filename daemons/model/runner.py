"""Forward passes over the paged KV cache: prefill with prefix reuse, and batched decode.

Prefill is computed layer by layer (so a layer's new blocks can be stored while later layers
run) and, within a layer, one block-aligned chunk of ``block_size`` tokens at a time. The chunking
is what makes stored KV reusable bit for bit: every chunk's matmuls have the same shape and the
same inputs whether the prompt was computed cold or after loading its prefix, so the KV of block
k is a function of tokens 0..k only. (One matmul over all new tokens would not be: BLAS kernels
round differently for different row counts.) Decode makes no such promise, and needs none: its
KV is never stored under a prefix key.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from daemons.model.attention import attend
from daemons.model.kv_cache import KVCache
from daemons.model.layers import DecoderLayer
from daemons.model.llama import LlamaModel
from daemons.model.sequence import Sequence

# Called after layer ``layer`` has written its KV for every new token, with the pages that are
# new and full (the prefix hash chain has a key for each). The partial tail page is not included.
LayerDone = Callable[[int, list[int]], None]


def reusable_blocks(num_prompt_tokens: int, block_size: int, hit_blocks: int) -> int:
    """How many of the ``hit_blocks`` cached prefix blocks to load: at least one prompt token must
    still be computed, because its logits give the first generated token."""
    return max(0, min(hit_blocks, (num_prompt_tokens - 1) // block_size))


def prefill_layer(kv_cache: KVCache, index: int, layer: DecoderLayer, block_table: list[int],
                  hidden: torch.Tensor, start: int) -> torch.Tensor:
    """Layer ``index`` over hidden states [T, hidden] of tokens ``start``..``start + T``, one
    block-sized piece at a time (``start`` on a block boundary), writing their KV; returns the
    layer's output. Shared by the whole-model prefill and the pipeline stages, so a block's KV and
    hidden states are the same bits whichever of the two computed them, in whatever chunks."""
    size, end = kv_cache.layout.block_size, start + hidden.shape[0]
    positions = torch.arange(start, end)
    outputs = []
    for a in range(start, end, size):
        b = min(a + size, end)
        x, pos = hidden[a - start:b - start], positions[a - start:b - start]
        q, k, v = layer.qkv(x, pos)
        kv_cache.write(index, block_table, pos, k, v)
        keys, values = kv_cache.gather(index, block_table, b)
        outputs.append(layer.finish(x, attend(q, keys, values, pos)))
    return torch.cat(outputs)


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        if kv_cache.layout.num_layers != model.config.num_layers:
            raise ValueError("KV cache layout does not match the model's layers")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.layout.block_size

    @torch.no_grad()
    def prefill(self, seq: Sequence, on_layer_done: LayerDone | None = None) -> torch.Tensor:
        """Compute KV of ``seq``'s tokens from ``seq.num_kv_tokens`` on; float32 logits [vocab]
        of its last token.

        ``seq.num_kv_tokens`` tokens (whole blocks) must already be in its pages, e.g. imported
        from the store, and its block table must cover every token.
        """
        start, end, size = seq.num_kv_tokens, len(seq), self.block_size
        if start % size or not 0 <= start < end:
            raise ValueError(f"prefill must start at a block boundary before the last token, got {start} of {end}")
        if len(seq.block_table) * size < end:
            raise ValueError(f"block table of {len(seq.block_table)} pages cannot hold {end} tokens")
        hidden = self.model.embed(torch.tensor(seq.token_ids[start:end]))
        new_full_blocks = seq.block_table[start // size:end // size]
        for index, layer in enumerate(self.model.layers):
            hidden = prefill_layer(self.kv_cache, index, layer, seq.block_table, hidden, start)
            if on_layer_done is not None:
                on_layer_done(index, new_full_blocks)
        seq.num_kv_tokens = end
        return self.model.logits(hidden[-1:])[0]

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step for a batch: each sequence's last token (whose KV is not yet in its pages)
        goes through the model; returns float32 logits [len(seqs), vocab] of the next tokens."""
        for seq in seqs:
            if seq.num_kv_tokens != len(seq) - 1:
                raise ValueError(f"sequence {seq.seq_id!r} has KV for {seq.num_kv_tokens} of {len(seq)} tokens")
            if len(seq.block_table) * self.block_size < len(seq):
                raise ValueError(f"sequence {seq.seq_id!r} has no page for token {len(seq) - 1}")
        positions = torch.tensor([len(seq) - 1 for seq in seqs])
        hidden = self.model.embed(torch.tensor([seq.token_ids[-1] for seq in seqs]))
        for index, layer in enumerate(self.model.layers):
            q, k, v = layer.qkv(hidden, positions)
            rows = []
            # Projections and MLP run batched; attention runs per sequence because each has
            # its own context length and pages.
            for i, seq in enumerate(seqs):
                pos = positions[i:i + 1]
                self.kv_cache.write(index, seq.block_table, pos, k[i:i + 1], v[i:i + 1])
                keys, values = self.kv_cache.gather(index, seq.block_table, len(seq))
                rows.append(attend(q[i:i + 1], keys, values, pos))
            hidden = layer.finish(hidden, torch.cat(rows))
        for seq in seqs:
            seq.num_kv_tokens = len(seq)
        return self.model.logits(hidden)
