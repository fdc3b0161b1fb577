"""Allocation strategies: in which order a put tries the mounted segments.

Pure policy. The master walks the returned order and puts each replica on the next segment that
is not already used by the object and has a free range that fits. Preferred segments always come
first, in the order the writer gave.

- ``random`` spreads load without coordination: start at a random segment and go round in mount
  order (Mooncake's scan, which also keeps the choice cheap with thousands of segments).
- ``free_ratio_first`` balances usage: emptiest segment (by free/total) first.
- ``local_first`` keeps the bytes on the writer's host (shared memory instead of the network):
  local segments first, each group in the random round order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from store.objects import SegmentState


def placement_order(
    strategy: str,
    segments: Sequence[SegmentState],
    preferred: Sequence[str],
    is_local: Callable[[SegmentState], bool],
    rng: random.Random,
) -> list[SegmentState]:
    by_id = {s.segment_id: s for s in segments}
    wanted = dict.fromkeys(preferred)
    first = [by_id[sid] for sid in wanted if sid in by_id]
    rest = [s for s in segments if s.segment_id not in wanted]
    if rest:
        start = rng.randrange(len(rest))
        rest = rest[start:] + rest[:start]
    if strategy == "free_ratio_first":
        rest.sort(key=lambda s: -s.free_ratio)  # stable: ties keep the random round order
    elif strategy == "local_first":
        rest.sort(key=lambda s: not is_local(s))
    return first + rest
