"""Hit rate as a function of cache capacity (the paper's Figure 9).

Requests are replayed in arrival order through one LRU cache of the given capacity; a request
reuses its leading cached blocks (capped at its length, since the last block may be partial) and
then stores all of its blocks. With infinite capacity this is the trace's own reuse ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.sim.lru import BlockLRU
from scheduler.sim.trace import TRACE_BLOCK_TOKENS, TraceRequest


def hit_rate(requests: Sequence[TraceRequest], capacity_tokens: int | None,
             block_tokens: int = TRACE_BLOCK_TOKENS) -> float:
    cache = BlockLRU("sweep", None if capacity_tokens is None else capacity_tokens // block_tokens)
    hit = total = 0
    for request in requests:
        blocks = cache.leading_hits(request.hash_ids)
        hit += min(blocks * block_tokens, request.input_length)
        total += request.input_length
        cache.insert(request.hash_ids)
    return hit / total if total else 0.0


DEFAULT_CAPACITIES = (250_000, 500_000, 1_000_000, 3_000_000, 10_000_000, 30_000_000,
                      50_000_000, 100_000_000, None)


def capacity_sweep(requests: Sequence[TraceRequest],
                   capacities: Sequence[int | None] = DEFAULT_CAPACITIES) -> list[dict]:
    """``[{"capacity_tokens": int | None (infinite), "hit_rate": float}, ...]``"""
    return [{"capacity_tokens": c, "hit_rate": hit_rate(requests, c)} for c in capacities]
