"""The global cache index: which location holds which block.

A location is a prefill instance (its GPU and DRAM tiers) or the shared pool (``POOL``). The index is
updated only by events — a block stored, a block evicted, an instance gone, everything cleared —
so it is exactly as fresh as the events it is given: in the live conductor the master's KV events
(:mod:`daemons.serving.kv_events`), in the simulator its LRUs' calls.

Bounded: with ``max_blocks`` it keeps at most that many keys, and drops the least recently
matched or stored first (a match touches the keys it walked through, a store the keys it
stored), so what the conductor keeps is what its requests keep asking for; a chain is touched
deepest key first, so its leaves go before the prefix they extend. A dropped block only costs a
missed hit; its holders still have it.

The question the conductor asks is "for this chain of block keys, how many leading blocks does
each location hold?" Keys are chained (a key covers its whole prefix), so the answer for one
location is the index of its first missing key; one walk over the keys answers it for all
locations at once, narrowing the set of locations that still match.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Hashable, Iterable, Sequence

POOL = "pool"
TIER_BITS = {"gpu": 1, "dram": 2, "pool": 4}


@dataclass
class PrefixMatch:
    """Leading blocks held per location, and the best location(s) overall."""

    lengths: dict[str, int] = field(default_factory=dict)  # only locations with length > 0
    best_len: int = 0
    best_holders: tuple[str, ...] = ()

    def length(self, location: str) -> int:
        return self.lengths.get(location, 0)


class CacheIndex:
    def __init__(self, max_blocks: int | None = None) -> None:
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks  # None: unbounded (the simulator's LRUs bound it already)
        # key -> location -> tier bitmask; least recently matched or stored first
        self._holders: OrderedDict[Hashable, dict[str, int]] = OrderedDict()
        self._blocks_of: dict[str, set[Hashable]] = {}
        self.num_events = 0
        self.num_dropped = 0  # keys dropped to stay within max_blocks

    # -- events -------------------------------------------------------------------------------

    def block_stored(self, location: str, keys: Iterable[Hashable], tier: str = "dram") -> None:
        bit = TIER_BITS[tier]
        owned = self._blocks_of.setdefault(location, set())
        # Deepest first, so a chain's root ends up the most recent: dropping from the old end
        # then takes leaves before the prefixes they hang on.
        for key in reversed(list(keys)):
            holders = self._holders.get(key)
            if holders is None:
                holders = self._holders[key] = {}
            else:
                self._holders.move_to_end(key)
            holders[location] = holders.get(location, 0) | bit
            owned.add(key)
        self.num_events += 1
        self._drop_over_bound()

    def block_evicted(self, location: str, keys: Iterable[Hashable], tier: str = "dram") -> None:
        bit = TIER_BITS[tier]
        owned = self._blocks_of.get(location, set())
        for key in keys:
            holders = self._holders.get(key)
            if holders is None or location not in holders:
                continue  # a late or duplicate eviction report is harmless
            mask = holders[location] & ~bit
            if mask:
                holders[location] = mask
                continue
            del holders[location]
            owned.discard(key)
            if not holders:
                del self._holders[key]
        self.num_events += 1

    def clear(self) -> None:
        """Every block is gone everywhere (the store was cleared, or the index is rebuilt)."""
        self._holders.clear()
        self._blocks_of.clear()
        self.num_events += 1

    def location_removed(self, location: str) -> None:
        """An instance died or left: forget every block it held."""
        for key in self._blocks_of.pop(location, set()):
            holders = self._holders.get(key)
            if holders is not None:
                holders.pop(location, None)
                if not holders:
                    del self._holders[key]

    # -- queries ------------------------------------------------------------------------------

    def holders(self, key: Hashable) -> dict[str, int]:
        return dict(self._holders.get(key, {}))

    def num_blocks(self, location: str) -> int:
        return len(self._blocks_of.get(location, ()))

    def num_keys(self) -> int:
        """Distinct keys held anywhere. (Not ``__len__``: an empty index must stay truthy, callers
        write ``index or CacheIndex()``.)"""
        return len(self._holders)

    def sizes(self) -> dict[str, int]:
        """Blocks per location."""
        return {location: len(keys) for location, keys in self._blocks_of.items() if keys}

    def match(self, keys: Sequence[Hashable]) -> PrefixMatch:
        result = PrefixMatch()
        alive: set[str] = set()
        for depth, key in enumerate(keys):
            holders = self._holders.get(key)
            if not holders:
                break
            if depth == 0:
                alive = set(holders)
            else:
                for gone in alive.difference(holders):
                    result.lengths[gone] = depth
                alive.intersection_update(holders)
                if not alive:
                    break
            result.best_holders = tuple(sorted(alive))
            result.best_len = depth + 1
        for location in alive:
            result.lengths[location] = result.best_len
        for key in reversed(keys[:result.best_len]):
            self._holders.move_to_end(key)  # asked for: worth keeping, root last (see block_stored)
        return result

    def _drop_over_bound(self) -> None:
        if self.max_blocks is None:
            return
        while len(self._holders) > self.max_blocks:
            key, holders = self._holders.popitem(last=False)
            for location in holders:
                self._blocks_of[location].discard(key)
            self.num_dropped += 1
