"""Each daemon's Prometheus registry, and small builders for the families its collector yields.

A daemon owns one :class:`prometheus_client.CollectorRegistry` (never the process-wide default,
so two daemons in one process, as in tests, never share a series). Gauges and most counters are
read from the daemon's live state at scrape time by :class:`LiveCollector`, so they cannot go
stale and the hot paths pay nothing; only what the state does not keep (the master's value-size
histogram, its per-RPC counts) is recorded as it happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class LiveCollector(Collector):
    """The families ``families()`` builds from live state, at each scrape."""

    def __init__(self, families: Callable[[], Iterable[Metric]]) -> None:
        self.families = families

    def describe(self) -> list:
        # Nothing to check for clashes at registration: the values exist only at scrape time.
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.families()


def daemon_registry(families: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A registry with the process's own series (process_cpu_seconds_total, resident memory,
    open fds: prometheus_client reads them from /proc) and the daemon's live ones."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(LiveCollector(families))
    return registry


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def labelled_gauge(name: str, documentation: str, label: str, values: dict[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for label_value, value in values.items():
        family.add_metric([label_value], value)
    return family


def counter(name: str, documentation: str, value: float) -> Metric:
    """A counter under exactly ``name``. prometheus_client writes a counter as ``<name>_total``;
    Mooncake's master names a few counters without it (master_evicted_key_count,
    master_put_start_discard_cnt), and dashboards written for it query those names. Such a name
    is written as an untyped series (its TYPE line would otherwise name ``<name>_total`` above a
    sample that does not); Prometheus's rate() and increase() treat it as the counter it is."""
    if name.endswith("_total"):
        return CounterMetricFamily(name, documentation, value=value)
    family = Metric(name, documentation, "unknown")
    family.add_sample(name, {}, value)
    return family


def labelled_counter(name: str, documentation: str, label: str, values: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for label_value, value in values.items():
        family.add_metric([label_value], value)
    return family
