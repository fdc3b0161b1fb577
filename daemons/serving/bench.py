"""`mooncake bench serve`: replay a slice of a request trace against the running cluster.

The trace's requests are scaled to the tiny model while keeping their prefix structure: each
trace block (a hash id, 512 tokens in the release) becomes one KV block of the cluster's
``kv_block_tokens`` tokens whose content is drawn from the hash id alone, so two requests sharing
trace blocks share exactly those blocks of tokens; at most ``max_blocks`` blocks per request,
outputs cut to ``max_tokens``. Arrivals keep the trace's timing, compressed by ``speedup``.

Each slice is replayed twice, open loop: with prefix reuse, and with ``prefix_reuse: false``
(no load from and no store to the store). The runs draw token contents under different salts,
so neither finds the other's blocks in the store.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from daemons.serving.client import Completion, stream_completion
from daemons.serving.errors import Rejected, ServingError
from scheduler.sim.trace import TraceRequest

BOS = 256


@dataclass
class Replayed:
    prompt_tokens: int
    completion: Completion | None = None
    error: ServingError | None = None


@dataclass
class RunReport:
    reuse: bool
    results: list[Replayed] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        done = [r.completion for r in self.results if r.completion is not None]
        ttft = sorted(c.client_ttft * 1000 for c in done if c.client_ttft is not None)
        tbt = sorted(g * 1000 for c in done for g in c.client_gaps)
        prompt = sum(r.prompt_tokens for r in self.results if r.completion is not None)
        hit = sum(c.mooncake.get("prefix_tokens", 0) for c in done)
        return {
            "prefix_reuse": self.reuse, "requests": len(self.results), "completed": len(done),
            "rejected": sum(isinstance(r.error, Rejected) for r in self.results),
            "failed": sum(r.error is not None and not isinstance(r.error, Rejected) for r in self.results),
            "ttft_ms": _percentiles(ttft), "tbt_ms": _percentiles(tbt),
            "hit_rate": hit / prompt if prompt else 0.0,
            "tokens_per_s": sum(len(c.token_ids) for c in done) / self.seconds if self.seconds else 0.0,
        }


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "mean": statistics.fmean(values)}


def scale(trace: list[TraceRequest], block_tokens: int, max_blocks: int, max_tokens: int,
          salt: str) -> list[tuple[float, list[int], int]]:
    """(arrival, prompt token ids, max_tokens) per trace request."""
    blocks: dict[int, list[int]] = {}
    scaled = []
    for request in trace:
        tokens = [BOS]
        for hash_id in request.hash_ids[:max_blocks]:
            if hash_id not in blocks:
                rng = random.Random(f"{salt}:{hash_id}")
                blocks[hash_id] = [rng.randrange(256) for _ in range(block_tokens)]
            tokens += blocks[hash_id]
        scaled.append((request.arrival, tokens, max(1, min(request.output_length, max_tokens))))
    return scaled


def replay(url: str, requests: list[tuple[float, list[int], int]], reuse: bool, timeout: float,
           concurrency: int = 64) -> RunReport:
    report = RunReport(reuse, [Replayed(len(tokens)) for _, tokens, _ in requests])

    def one(index: int) -> None:
        _, tokens, max_tokens = requests[index]
        try:
            report.results[index].completion = stream_completion(
                url, {"prompt": tokens, "max_tokens": max_tokens, "prefix_reuse": reuse}, timeout)
        except ServingError as exc:
            report.results[index].error = exc

    began = time.monotonic()
    with ThreadPoolExecutor(concurrency, thread_name_prefix="bench-serve") as pool:
        for index, (arrival, _, _) in enumerate(requests):
            time.sleep(max(0.0, began + arrival - time.monotonic()))
            pool.submit(one, index)
    report.seconds = time.monotonic() - began
    return report
