"""Forward passes over the paged KV cache: prefill with prefix reuse, and batched decode.

Prefill is computed layer by layer (so a layer's new blocks can be stored while later layers
run) and, within a layer, one block-aligned chunk of ``block_size`` tokens at a time. The chunking
is what makes stored KV reusable bit for bit: every chunk's matmuls have the same shape and the
same inputs whether the prompt was computed cold or after loading its prefix, so the KV of block
k is a function of tokens 0..k only. (One matmul over all new tokens would not be: BLAS kernels
round differently for different row counts.) Decode makes no such promise, and needs none: its
KV is never stored under a prefix key. It runs the whole batch as tensor operations instead:
each layer writes every sequence's new K and V with one indexed assignment, gathers all their
pages into keys and values padded to the longest context, and attends in one masked call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from daemons.model.attention import KeyMask, attend, attend_padded
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
    positions = torch.arange(start, end, device=hidden.device)
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
        if kv_cache.device != model.device:
            raise ValueError(f"KV pages on {kv_cache.device}, the model on {model.device}")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.layout.block_size
        # Decode gathers each layer's keys and values here: kept from step to step (and grown
        # when a step needs more), since a fresh multi-MiB tensor per layer would spend more on
        # faulting in new pages than on the copy. Holds the largest batch x context seen so far,
        # and makes decode one caller at a time (a decode worker's one loop thread).
        self._gathered = torch.empty(0, dtype=kv_cache.layout.dtype, device=kv_cache.device)

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
        hidden = self.model.embed(torch.tensor(seq.token_ids[start:end], device=self.kv_cache.device))
        new_full_blocks = seq.block_table[start // size:end // size]
        for index, layer in enumerate(self.model.layers):
            hidden = prefill_layer(self.kv_cache, index, layer, seq.block_table, hidden, start)
            if on_layer_done is not None:
                on_layer_done(index, new_full_blocks)
        seq.num_kv_tokens = end
        return self.model.logits(hidden[-1:])[0]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step for a batch: each sequence's last token (whose KV is not yet in its pages)
        goes through the model; returns float32 logits [len(seqs), vocab] of the next tokens.

        The whole batch is tensor work, layer by layer: projections and MLP over [B, hidden];
        every sequence's new K and V written with one indexed assignment; the pages of all
        sequences gathered into keys and values padded to the longest context; one attention
        call masked by each sequence's length. The only Python loops over the batch build the
        step's index tensors, once for all layers.
        """
        if not seqs:
            raise ValueError("a decode step needs at least one sequence")
        for seq in seqs:
            if seq.num_kv_tokens != len(seq) - 1:
                raise ValueError(f"sequence {seq.seq_id!r} has KV for {seq.num_kv_tokens} of {len(seq)} tokens")
            if len(seq.block_table) * self.block_size < len(seq):
                raise ValueError(f"sequence {seq.seq_id!r} has no page for token {len(seq) - 1}")
        step = _DecodeStep.of(seqs, self.block_size, self.kv_cache.layout.dtype, self.kv_cache.device)
        keys, values = self._gather_buffers(len(seqs), step.block_tables.shape[1] * self.block_size)
        hidden = self.model.embed(torch.tensor([seq.token_ids[-1] for seq in seqs], device=self.kv_cache.device))
        for index, layer in enumerate(self.model.layers):
            q, k, v = layer.qkv(hidden, step.positions)
            self.kv_cache.write_slots(index, step.write_pages, step.write_slots, k, v)
            self.kv_cache.gather_pages(index, step.block_tables, keys, values)
            hidden = layer.finish(hidden, attend_padded(q, keys, values, step.mask))
        for seq in seqs:
            seq.num_kv_tokens = len(seq)
        return self.model.logits(hidden)

    def _gather_buffers(self, batch: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [batch, width, kv_heads, D] for one step, in the kept buffer."""
        shape = (batch, width, self.kv_cache.layout.num_kv_heads, self.kv_cache.layout.head_dim)
        size = math.prod(shape)
        if self._gathered.numel() < 2 * size:
            self._gathered = torch.empty(2 * size, dtype=self._gathered.dtype, device=self._gathered.device)
        return self._gathered[:size].view(shape), self._gathered[size:2 * size].view(shape)


@dataclass(frozen=True)
class _DecodeStep:
    """The index tensors of one decode step, built once and used by every layer, on the pages' device."""

    positions: torch.Tensor  # [B] position of each sequence's new token
    write_pages: torch.Tensor  # [B] page and slot where that token's K and V go
    write_slots: torch.Tensor
    block_tables: torch.Tensor  # [B, P] pages of positions 0..P*block_size-1, padded with page 0
    mask: KeyMask

    @classmethod
    def of(cls, seqs: list[Sequence], block_size: int, dtype: torch.dtype, device: torch.device) -> _DecodeStep:
        lengths = [len(seq) for seq in seqs]
        num_pages = -(-max(lengths) // block_size)
        # Pages reserved beyond the longest context are left out; a shorter table is padded with
        # page 0, whose contents attention then zeroes and masks like any position past a length.
        tables = [table + [0] * (num_pages - len(table)) for table in (seq.block_table[:num_pages] for seq in seqs)]
        positions = torch.tensor(lengths, device=device) - 1
        return cls(
            positions=positions,
            write_pages=torch.tensor([table[(n - 1) // block_size] for table, n in zip(tables, lengths)], device=device),
            write_slots=positions % block_size,
            block_tables=torch.tensor(tables, device=device),
            mask=KeyMask.of_lengths(positions + 1, num_pages * block_size, dtype),
        )
