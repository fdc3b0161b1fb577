"""The paged KV cache: one contiguous tensor holding every page of every layer.

Layout (C order, the model's dtype, little-endian)::

    [num_blocks, num_layers, 2 (K then V), block_size, num_kv_heads, head_dim]

A page (block) is the outermost dimension, so one block of all layers is one contiguous byte
range, and within it one layer of that block is again contiguous. Both are what moves: a whole
block to or from the store or to the decode worker is one transfer-engine slice, and a prefill
worker storing layer by layer writes the layer's sub-range. Keys are stored after the rotary
embedding. The tensor is allocated once, so a worker registers it with the transfer engine once
(:meth:`KVCache.transfer_buffer`) and addresses pages by the byte offsets below.

The pages live on the model's device. On a GPU the transfer engine gets the CUDA tensor itself
and stages its bytes through pinned host memory; bytes exported or imported here pass through
the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from daemons.model.config import ModelConfig


@dataclass(frozen=True)
class KVCacheLayout:
    num_blocks: int
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    @classmethod
    def for_model(cls, config: ModelConfig, block_size: int, num_blocks: int) -> KVCacheLayout:
        if block_size <= 0 or num_blocks <= 0:
            raise ValueError(f"block_size and num_blocks must be positive, got {block_size}, {num_blocks}")
        return cls(num_blocks, config.num_layers, block_size, config.num_kv_heads, config.head_dim,
                   config.torch_dtype)

    @classmethod
    def for_memory(cls, config: ModelConfig, block_size: int, nbytes: int) -> KVCacheLayout:
        """As many pages as fit in ``nbytes`` (the kv_cache_size setting)."""
        one = cls.for_model(config, block_size, 1)
        return cls.for_model(config, block_size, max(1, nbytes // one.block_bytes))

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_blocks, self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def layer_block_bytes(self) -> int:
        """Bytes of one layer of one block: K then V, each [block_size, kv_heads, head_dim]."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * itemsize

    @property
    def block_bytes(self) -> int:
        return self.num_layers * self.layer_block_bytes

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def block_offset(self, block_id: int) -> int:
        """Byte offset of block ``block_id`` (all layers) from the start of the cache."""
        self._check(block_id)
        return block_id * self.block_bytes

    def layer_block_offset(self, layer: int, block_id: int) -> int:
        """Byte offset of one layer of one block."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} outside 0..{self.num_layers - 1}")
        return self.block_offset(block_id) + layer * self.layer_block_bytes

    def _check(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} outside 0..{self.num_blocks - 1}")


class KVCache:
    """The pages themselves, with byte-level export/import and token-level write/gather."""

    def __init__(self, layout: KVCacheLayout, buffer: np.ndarray | None = None,
                 device: torch.device | str = "cpu") -> None:
        """Pages in fresh memory on ``device``, or over ``buffer``: a writable uint8 array of at
        least ``layout.nbytes`` bytes in host memory, e.g. the transfer engine's
        ``allocate_shared_buffer``."""
        self.layout = layout
        if buffer is None:
            self.tensor = torch.zeros(layout.shape, dtype=layout.dtype, device=device)
        else:
            if torch.device(device).type != "cpu":
                raise ValueError(f"pages over a host buffer live on the CPU, not {device}")
            if buffer.dtype != np.uint8 or buffer.size < layout.nbytes:
                raise ValueError(f"buffer must be uint8 with >= {layout.nbytes} bytes")
            raw = torch.from_numpy(buffer.reshape(-1)[:layout.nbytes])
            self.tensor = raw.view(layout.dtype).view(layout.shape)
        self.device = self.tensor.device
        self._bytes = self.tensor.view(-1).view(torch.uint8)
        # Per layer, the keys and the values of every page as rows [num_blocks, block_size *
        # kv_heads * head_dim]: views made once, what a decode step gathers pages from.
        self._page_rows = [(self.tensor[:, layer, 0].flatten(1), self.tensor[:, layer, 1].flatten(1))
                           for layer in range(layout.num_layers)]

    def numpy(self) -> np.ndarray:
        """The whole cache as a flat writable uint8 array sharing its memory (pages on the CPU)."""
        return self._bytes.numpy()

    def transfer_buffer(self) -> np.ndarray | torch.Tensor:
        """What to register with a transfer engine, once: on the CPU the whole cache as a flat
        writable uint8 array sharing its memory; on a GPU the CUDA tensor itself, which the
        engine stages through a pinned host mirror (``transfer.gpu``). Its address is byte 0
        of the cache either way."""
        return self.numpy() if self.device.type == "cpu" else self.tensor

    def copy_pages_from(self, source: KVCache, block_ids: list[int]) -> None:
        """Copy pages ``block_ids`` (all layers) of ``source``, a cache of the same layout on
        another device, into the same pages here (a decode worker's pages landed in host memory
        and moving to its GPU)."""
        if source.layout != self.layout:
            raise ValueError("copying pages needs caches of the same layout")
        pages = torch.tensor(block_ids, dtype=torch.long)
        self.tensor[pages.to(self.device)] = source.tensor[pages.to(source.device)].to(self.device)

    def _span(self, block_id: int, layer: int | None) -> slice:
        if layer is None:
            start, length = self.layout.block_offset(block_id), self.layout.block_bytes
        else:
            start, length = self.layout.layer_block_offset(layer, block_id), self.layout.layer_block_bytes
        return slice(start, start + length)

    def export_block(self, block_id: int, layer: int | None = None) -> bytes:
        """One block's KV (all layers, or one layer) exactly as it lies in the cache."""
        return self._bytes[self._span(block_id, layer)].cpu().numpy().tobytes()

    def import_block(self, block_id: int, data: bytes | memoryview, layer: int | None = None) -> None:
        """Write bytes produced by :meth:`export_block` (here or on another worker) into a page."""
        span = self._span(block_id, layer)
        incoming = np.frombuffer(data, dtype=np.uint8)
        if incoming.size != span.stop - span.start:
            raise ValueError(f"block data is {incoming.size} bytes, expected {span.stop - span.start}")
        self._bytes[span] = torch.from_numpy(incoming.copy()).to(self.device)

    def write(self, layer: int, block_table: list[int], positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, D] of tokens at absolute ``positions`` of one sequence."""
        size = self.layout.block_size
        pages = torch.tensor(block_table, dtype=torch.long, device=self.device)[positions // size]
        self.write_slots(layer, pages, positions % size, k, v)

    def write_slots(self, layer: int, pages: torch.Tensor, slots: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, D] of T tokens, token i at slot ``slots[i]`` of page ``pages[i]``.

        One indexed assignment whatever sequences the tokens belong to: a decode step writes the
        new token of every sequence in the batch with one call.
        """
        self.tensor[pages, layer, :, slots] = torch.stack((k, v), dim=1)

    def gather(self, layer: int, block_table: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [num_tokens, kv_heads, D] of positions 0..num_tokens-1 of one sequence."""
        size = self.layout.block_size
        used = torch.tensor(block_table[:-(-num_tokens // size)], dtype=torch.long, device=self.device)
        pages = self.tensor[used, layer]  # [blocks, 2, block_size, kv_heads, D]
        shape = (-1, self.layout.num_kv_heads, self.layout.head_dim)
        return pages[:, 0].reshape(shape)[:num_tokens], pages[:, 1].reshape(shape)[:num_tokens]

    def gather_pages(self, layer: int, block_tables: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy the keys and values of the pages ``block_tables`` [B, P] lists for B sequences into
        ``keys`` and ``values`` [B, P * block_size, kv_heads, D] (contiguous), position by
        position: row b gets sequence b's positions 0..P*block_size-1, whatever its pages hold
        past its own length.

        One ``index_select`` for the keys and one for the values, for the whole batch, into
        memory the caller keeps from step to step: a fresh tensor of a few MiB every layer would
        be new pages from the kernel, and faulting them in costs more than the copy.
        """
        pages = block_tables.reshape(-1)
        key_rows, value_rows = self._page_rows[layer]
        torch.index_select(key_rows, 0, pages, out=keys.view(pages.shape[0], -1))
        torch.index_select(value_rows, 0, pages, out=values.view(pages.shape[0], -1))
