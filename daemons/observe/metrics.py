"""Builders of the metric families a daemon's ``metric_families`` yields at each scrape.

prometheus_client is imported when a family is built, not with this module: the daemons import
this module at start, and one that serves no metrics (``metrics_port`` 0) would pay 40 ms for it.
"""

from __future__ import annotations

from typing import Any


def gauge(name: str, documentation: str, value: float) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, documentation, value=value)


def labelled_gauge(name: str, documentation: str, label: str, values: dict[str, float]) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=[label])
    for label_value, value in values.items():
        family.add_metric([label_value], value)
    return family


def counter(name: str, documentation: str, value: float) -> Any:
    """A counter under exactly ``name``. prometheus_client writes a counter as ``<name>_total``;
    Mooncake's master names a few counters without it (master_evicted_key_count,
    master_put_start_discard_cnt), and dashboards written for it query those names. Such a name
    is written as an untyped series (its TYPE line would otherwise name ``<name>_total`` above a
    sample that does not); Prometheus's rate() and increase() treat it as the counter it is."""
    from prometheus_client.core import CounterMetricFamily, Metric

    if name.endswith("_total"):
        return CounterMetricFamily(name, documentation, value=value)
    family = Metric(name, documentation, "unknown")
    family.add_sample(name, {}, value)
    return family


def labelled_counter(name: str, documentation: str, label: str, values: dict[str, float]) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, documentation, labels=[label])
    for label_value, value in values.items():
        family.add_metric([label_value], value)
    return family
