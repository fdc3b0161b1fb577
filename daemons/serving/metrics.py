"""The conductor's serving metrics, rendered in the Prometheus text exposition format (0.0.4).

A few counters, gauges and histograms are all `GET /metrics` needs, so they are written out here
rather than pulled in from a client library. Every update takes one lock; updates are per
request or per token, far below where that lock would matter.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]


def series(name: str, **labels: str) -> Series:
    """The key of one time series (a metric and its labels), as counters and gauges are kept."""
    return name, tuple(sorted(labels.items()))


def _labels(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        return out + [f"{name}_sum {self.sum}", f"{name}_count {running}"]


class ServingMetrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tbt = Histogram(TBT_BUCKETS)
        self.counters: dict[Series, float] = {}

    def count(self, name: str, amount: float = 1, **labels: str) -> None:
        key = series(name, **labels)
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + amount

    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft.observe(seconds)

    def observe_tbt(self, seconds: float) -> None:
        with self.lock:
            self.tbt.observe(seconds)

    def render(self, gauges: Callable[[], dict[Series, float]]) -> str:
        """The exposition text; ``gauges`` reads the live values (queue lengths, batch sizes)."""
        lines = [
            "# HELP mooncake_ttft_seconds Time to first token, arrival at the conductor to first token.",
            "# TYPE mooncake_ttft_seconds histogram",
        ]
        with self.lock:
            lines += self.ttft.lines("mooncake_ttft_seconds")
            lines += ["# HELP mooncake_tbt_seconds Time between consecutive tokens of one request.",
                      "# TYPE mooncake_tbt_seconds histogram", *self.tbt.lines("mooncake_tbt_seconds")]
            counters = sorted(self.counters.items())
        for (name, labels), value in counters:
            if not lines[-1].startswith(name):
                lines.append(f"# TYPE {name} counter")
            lines.append(f"{name}{_labels(labels)} {value:g}")
        for (name, labels), value in sorted(gauges().items()):
            if not lines[-1].startswith(name):
                lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name}{_labels(labels)} {value:g}")
        return "\n".join(lines) + "\n"
