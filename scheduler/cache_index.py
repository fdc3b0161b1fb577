"""The global cache index: which location holds which block.

A location is a prefill instance (its GPU and DRAM tiers) or the shared pool (``POOL``). The index is
updated only by events — a block stored, a block evicted, an instance gone — so it is exactly as
fresh as the reports the conductor receives, and the simulator drives it through the same calls.

The question the conductor asks is "for this chain of block keys, how many leading blocks does
each location hold?" Keys are chained (a key covers its whole prefix), so the answer for one
location is the index of its first missing key; one walk over the keys answers it for all
locations at once, narrowing the set of locations that still match.
"""

from __future__ import annotations

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
    def __init__(self) -> None:
        self._holders: dict[Hashable, dict[str, int]] = {}  # key -> location -> tier bitmask
        self._blocks_of: dict[str, set[Hashable]] = {}
        self.num_events = 0

    # -- events -------------------------------------------------------------------------------

    def block_stored(self, location: str, keys: Iterable[Hashable], tier: str = "dram") -> None:
        bit = TIER_BITS[tier]
        owned = self._blocks_of.setdefault(location, set())
        for key in keys:
            holders = self._holders.setdefault(key, {})
            holders[location] = holders.get(location, 0) | bit
            owned.add(key)
        self.num_events += 1

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
        return result
