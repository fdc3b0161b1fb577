"""Which objects may be evicted, and in which order.

Pure policy over the master's LRU order (complete objects, least recently used first; an object
moves to the back when it completes or is read). An object is evictable when no reader holds a
lease on it and it is not hard-pinned. Soft-pinned objects are offered only after every unpinned
one, and only when the policy allows it, so "evicted last" holds exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from store.objects import ObjectMeta


def eviction_candidates(
    lru: Iterable[str],
    objects: Mapping[str, ObjectMeta],
    now: float,
    allow_soft_pinned: bool,
) -> Iterator[ObjectMeta]:
    """Yield evictable objects, unpinned ones in LRU order, then soft-pinned ones in LRU order.

    The caller must not change ``lru`` while it iterates: collect victims, then drop them.
    """
    soft: list[ObjectMeta] = []  # met on the way, offered after the unpinned ones
    for key in lru:
        obj = objects[key]
        if obj.hard_pinned or obj.leased(now):
            continue
        if obj.soft_pinned(now):
            soft.append(obj)
        else:
            yield obj
    if allow_soft_pinned:
        yield from soft
