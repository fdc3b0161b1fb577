"""What one simulation run measured, and its JSON-able summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


def distribution(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    array = np.asarray(values)
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {"mean": float(array.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


@dataclass
class SimResult:
    params: dict
    num_requests: int = 0
    ttft: list[float] = field(default_factory=list)  # every prefilled request
    queue_seconds: list[float] = field(default_factory=list)  # of each: arrival to its job's start
    tbt: list[float] = field(default_factory=list)  # every decoded request: mean seconds/token
    goodput: int = 0  # decoded within both SLOs
    reasons: Counter = field(default_factory=Counter)  # decision reasons, rejections included
    input_tokens: int = 0  # of prefilled requests
    hit_tokens: int = 0
    prefill_compute_seconds: float = 0.0
    wasted_prefill_seconds: float = 0.0  # computed for requests then rejected at decode
    transfer_seconds: float = 0.0
    transferred_tokens: int = 0
    evicted_blocks: int = 0
    samples: list[dict] = field(default_factory=list)
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def rejected(self) -> int:
        return sum(self.reasons[r] for r in ("reject_ttft", "reject_tbt", "reject_decode"))

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def summary(self, with_samples: bool = False) -> dict:
        data = {
            **self.params,
            "requests": self.num_requests,
            "rejected": self.rejected,
            "rejected_by": {r: self.reasons[r] for r in ("reject_ttft", "reject_tbt", "reject_decode")},
            "decisions": {r: n for r, n in sorted(self.reasons.items()) if not r.startswith("reject")},
            "goodput": self.goodput,
            "ttft": distribution(self.ttft),
            "queue_seconds": distribution(self.queue_seconds),
            "tbt": distribution(self.tbt),
            "hit_rate": self.hit_rate,
            "prefill_gpu_seconds": self.prefill_compute_seconds,
            "wasted_prefill_seconds": self.wasted_prefill_seconds,
            "transfer_seconds": self.transfer_seconds,
            "transferred_tokens": self.transferred_tokens,
            "evicted_blocks": self.evicted_blocks,
            "sim_seconds": self.sim_seconds,
            "wall_seconds": self.wall_seconds,
        }
        if with_samples:
            data["samples"] = self.samples
        return data
