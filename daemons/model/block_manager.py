"""Which KV pages are free and which belong to which sequence (nano-vllm's BlockManager shape).

Pages are handed out from a FIFO free list, so a page freed long ago is reused before one freed
just now. Prefix reuse across requests goes through the store (keys from ``scheduler.block_hash``),
so pages are never shared between sequences here and need no reference counts.
"""

from __future__ import annotations

from collections import deque

from daemons.model.errors import KVCacheFull
from daemons.model.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def missing_blocks(self, seq: Sequence, num_tokens: int | None = None) -> int:
        """Pages ``seq`` still lacks to hold KV of ``num_tokens`` tokens (default: all it has)."""
        wanted = self.blocks_for(len(seq) if num_tokens is None else num_tokens)
        return max(0, wanted - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        return self.missing_blocks(seq, num_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int | None = None) -> list[int]:
        """Grow ``seq``'s block table to cover ``num_tokens``; returns the pages added.

        Nothing is taken when there are not enough pages: the caller gets :class:`KVCacheFull`
        and the sequence keeps exactly the pages it had. A decode worker may pass the prompt
        length plus max_tokens to reserve a request's whole life at admission.
        """
        missing = self.missing_blocks(seq, num_tokens)
        if missing > len(self._free):
            raise KVCacheFull(missing, len(self._free))
        added = [self._free.popleft() for _ in range(missing)]
        seq.block_table.extend(added)
        return added

    def deallocate(self, seq: Sequence) -> None:
        """Return all of ``seq``'s pages; its KV is gone from this worker."""
        self._free.extend(seq.block_table)
        seq.block_table.clear()
        seq.num_kv_tokens = 0
