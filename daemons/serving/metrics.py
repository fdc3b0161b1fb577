"""The conductor's serving metrics, kept and rendered by ``prometheus_client``.

Each :class:`ServingService` owns a :class:`ServingMetrics` with a registry of its own (never the
process-wide default one), so two services in one process (tests) never share a series. Counters
and histograms are updated where things happen; the gauges (queue lengths, batch sizes, the
policy's cost figures) are read from the service at scrape time by a collector, so they can never
go stale. The series names are what `mooncake bench serve` and the tests read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TBT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]

# The gauges the service reports (ServingService.gauges), with what each means.
GAUGE_HELP = {
    "mooncake_inflight_requests": "Requests the conductor is serving now.",
    "mooncake_prefill_queue_length": "Requests queued or running on a prefill worker, as the policy counts them.",
    "mooncake_decode_batch_size": "Sequences a decode worker (label worker) is stepping, as the policy counts them.",
    "mooncake_workers": "Live workers per role.",
    "mooncake_cost_kv_bytes_per_token": "KV bytes per token the policy prices transfers with.",
    "mooncake_cost_transfer_bandwidth_bytes": "Bytes per second the policy prices transfers with.",
    "mooncake_cost_prefill_seconds": "Terms of the prefill time model the policy plans with.",
    "mooncake_cost_tbt_seconds": "Terms of the decode step time model the policy plans with.",
}


def series(name: str, **labels: str) -> Series:
    """The key of one gauge series (a metric and its labels), as ServingService.gauges returns them."""
    return name, tuple(sorted(labels.items()))


class ServingMetrics:
    def __init__(self, gauges: Callable[[], dict[Series, float]]) -> None:
        """``gauges`` reads the live values at each scrape."""
        self.registry = CollectorRegistry()
        self.ttft = Histogram("mooncake_ttft_seconds", "Time to first token, arrival at the conductor to first token.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tbt = Histogram("mooncake_tbt_seconds", "Time between consecutive tokens of one request.",
                             buckets=TBT_BUCKETS, registry=self.registry)
        self.decisions = Counter("mooncake_decisions_total", "Requests scheduled, by the policy's reason.",
                                 ["reason"], registry=self.registry)
        self.rejections = Counter("mooncake_rejections_total", "Requests rejected, by reason.",
                                  ["reason"], registry=self.registry)
        self.requests = Counter("mooncake_requests_total", "Requests ended, by outcome (completed or failed).",
                                ["outcome"], registry=self.registry)
        self.prompt_tokens = Counter("mooncake_prompt_tokens_total", "Prompt tokens prefilled.",
                                     registry=self.registry)
        self.prefix_hit_tokens = Counter("mooncake_prefix_hit_tokens_total",
                                         "Prompt tokens whose KV was loaded from the store instead of computed.",
                                         registry=self.registry)
        self.replicated_blocks = Counter("mooncake_replicated_blocks_total",
                                         "Blocks a prefill worker pulled and kept as a new replica.",
                                         registry=self.registry)
        self.registry.register(_LiveGauges(gauges))

    content_type = CONTENT_TYPE_LATEST  # of what exposition() writes

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)


class _LiveGauges(Collector):
    def __init__(self, gauges: Callable[[], dict[Series, float]]) -> None:
        self.gauges = gauges

    def describe(self) -> list:
        # Nothing to check for clashes at registration: the names are fixed above, values come later.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_name: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for (name, labels), value in self.gauges().items():
            by_name[name].append((labels, value))
        for name, samples in sorted(by_name.items()):
            family = GaugeMetricFamily(name, GAUGE_HELP[name], labels=[k for k, _ in samples[0][0]])
            for labels, value in samples:
                family.add_metric([v for _, v in labels], value)
            yield family
