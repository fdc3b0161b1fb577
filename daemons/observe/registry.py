"""Each daemon's own Prometheus registry (never the process-wide default, so two daemons in one
process, as in tests, never share a series).

Gauges and most counters are read from the daemon's live state at scrape time by
:class:`LiveCollector`, so they cannot go stale and the hot paths pay nothing; only what the state
does not keep (the master's value-size histogram, its per-RPC counts) is recorded as it happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric
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
