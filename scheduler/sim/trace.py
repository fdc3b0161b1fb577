"""Reading request traces in the format of the Mooncake FAST'25 release.

One JSON object per line: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [one id per 512-token block, chained like our prefix keys]}``.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path
from collections import Counter
from collections.abc import Iterable

from scheduler.errors import TraceFormatError

TRACE_BLOCK_TOKENS = 512  # the release's hash_ids cover 512 tokens each


@dataclass(frozen=True)
class TraceRequest:
    arrival: float  # seconds from the start of the trace (after speedup)
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_trace(lines: Iterable[str], *, speedup: float = 1.0, limit: int | None = None,
                source: str = "trace") -> list[TraceRequest]:
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    requests: list[TraceRequest] = []
    for number, line in enumerate(lines, 1):
        if limit is not None and len(requests) >= limit:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            request = TraceRequest(float(row["timestamp"]) / 1000.0 / speedup, int(row["input_length"]),
                                   int(row["output_length"]), tuple(int(h) for h in row["hash_ids"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceFormatError(f"{source}:{number}: {exc.__class__.__name__}: {exc}") from None
        if request.input_length <= 0 or request.output_length < 0:
            raise TraceFormatError(f"{source}:{number}: lengths must be positive")
        requests.append(request)
    if any(b.arrival < a.arrival for a, b in zip(requests, requests[1:])):
        raise TraceFormatError(f"{source}: timestamps are not sorted")
    return requests


# The paper's conversation trace (kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl,
# git blob 5a371794b81d7fc7487ec8a02a2c631bcc7fbdf8: 12,031 requests), shipped xz-compressed (0.2 of
# its 3 MB) so that `mooncake bench serve` and the tests have it wherever the package is installed.
CONVERSATION_TRACE = Path(__file__).parent / "traces" / "conversation_trace.jsonl.xz"


def load_trace(path: str | Path, *, speedup: float = 1.0, limit: int | None = None) -> list[TraceRequest]:
    """A JSONL trace file, or one compressed with xz (a name ending in .xz)."""
    try:
        with (lzma.open(path, "rt") if str(path).endswith(".xz") else open(path)) as handle:
            return parse_trace(handle, speedup=speedup, limit=limit, source=str(path))
    except OSError as exc:
        raise TraceFormatError(f"{path}: {exc.strerror}") from None


def conversation_of(request: TraceRequest) -> tuple[int, ...]:
    """The conversation a request belongs to: its first two blocks. In the conversation trace
    every prompt starts with one shared block (the system prompt) and the next block is the
    conversation's first turn, which every later turn of it repeats (ids chain like prefix keys)."""
    return request.hash_ids[:2]


def multi_turn(requests: list[TraceRequest], min_turns: int) -> list[TraceRequest]:
    """The requests of conversations with at least ``min_turns`` requests in ``requests``, in
    trace order, arrivals moved so the first comes at 0.

    A window from the start of the trace holds mostly first turns (a conversation's next turn
    comes minutes later), so little of it can be reused whatever a policy does; this keeps the
    conversations whose later turns do come, which is the reuse prefix caching exists for.
    ``min_turns`` 1 keeps every request."""
    if min_turns < 1:
        raise ValueError("min_turns must be at least 1")
    turns = Counter(conversation_of(r) for r in requests)
    kept = [r for r in requests if turns[conversation_of(r)] >= min_turns]
    start = kept[0].arrival if kept else 0.0
    return [TraceRequest(r.arrival - start, r.input_length, r.output_length, r.hash_ids) for r in kept]
