"""An LRU cache of KV blocks at one location, reporting stores and evictions to the index.

The simulator's stand-in for an instance's DRAM segment (or the shared pool). Capacity is in
blocks; a block touched by a request becomes most recent, so a prompt's hot prefix outlives the
one-off tails that follow it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

from scheduler.cache_index import CacheIndex


class BlockLRU:
    def __init__(self, location: str, capacity_blocks: int | None, index: CacheIndex | None = None,
                 tier: str = "dram") -> None:
        self.location, self.capacity, self.index, self.tier = location, capacity_blocks, index, tier
        self.blocks: OrderedDict[Hashable, None] = OrderedDict()
        self.num_evicted = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def leading_hits(self, keys: Iterable[Hashable]) -> int:
        count = 0
        for key in keys:
            if key not in self.blocks:
                break
            count += 1
        return count

    def touch(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def insert(self, keys: Iterable[Hashable]) -> None:
        """Store (or refresh) blocks, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        added = []
        for key in keys:
            if key in self.blocks:
                self.blocks.move_to_end(key)
            else:
                self.blocks[key] = None
                added.append(key)
        if added and self.index is not None:
            self.index.block_stored(self.location, added, self.tier)
        if self.capacity is None or len(self.blocks) <= self.capacity:
            return
        evicted = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        self.num_evicted += len(evicted)
        if self.index is not None:
            self.index.block_evicted(self.location, evicted, self.tier)
