"""The master's Prometheus series, named as Mooncake's master names them where the meaning is the
same (``master_*``, ``segment_*``), ``mooncake_master_*`` otherwise.

Gauges and the state's own counters (:class:`store.stats.MasterStats`) are read under the store's
lock at scrape time. What the state does not keep is recorded as the ops run: the per-RPC request
and failure counts (:class:`CountedOps` wraps the registration of every op, so an op added later
is counted too) and the value-size histogram, observed on each successful PutStart as
Mooncake's master observes it (a put reservation's commit stands for its objects' PutStart).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from daemons.observe.master_http import MasterView, build_app
from daemons.observe.metrics import counter, gauge, labelled_counter, labelled_gauge
from store.tenants import tenant_of

# Our op -> the stem of Mooncake's master_<stem>_requests_total / _failures_total.
OFFICIAL_OPS = {
    "store.put_start": "put_start", "store.put_end": "put_end", "store.put_revoke": "put_revoke",
    "store.get_replica_list": "get_replica_list", "store.exists": "exist_key", "store.remove": "remove",
    "store.remove_all": "remove_all", "store.mount_segment": "mount_segment",
    "store.unmount_segment": "unmount_segment", "store.remount": "remount_segment", "store.ping": "ping",
    "store.copy_start": "copy_start", "store.copy_end": "copy_end", "store.copy_revoke": "copy_revoke",
    "store.batch_exists": "batch_exist_key", "store.batch_get_replica_list": "batch_get_replica_list",
    "store.batch_put_start": "batch_put_start", "store.batch_put_end": "batch_put_end",
    "store.batch_put_revoke": "batch_put_revoke",
}
# Mooncake's buckets: 4 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB, 64 MiB.
VALUE_SIZE_BUCKETS = (4096, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
# MasterStats fields whose meaning Mooncake's master exports under a name of its own.
OFFICIAL_STATS = {
    "num_evicted": ("master_evicted_key_count", "Total number of keys evicted"),
    "num_evicted_bytes": ("master_evicted_size_bytes", "Total bytes of evicted objects"),
    "num_preempted": ("master_put_start_discard_cnt",
                      "PutStarts older than put_start_discard_timeout taken over by a new PutStart"),
    "num_partial_allocations": ("master_put_start_partial_allocations_total",
                                "PutStart requests that got fewer replicas than requested"),
    "num_allocation_failures": ("master_put_start_alloc_failures_total",
                                "PutStart failures caused by replica allocation failure"),
    "num_promoted": ("master_promotion_completed_total", "Disk-only objects copied back to memory"),
    "num_promoted_bytes": ("master_promotion_completed_bytes_total", "Bytes promoted from disk to memory"),
}


class MasterMetrics:
    """The master daemon's series and HTTP endpoints; ``counted`` wraps each RPC server its ops
    are registered on (the plain one, or HA's gate) so that every op is counted."""

    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon
        self.rpc_counts = RpcCounts()

    def counted(self, server: Any) -> CountedOps:
        return CountedOps(server, self.rpc_counts)

    def app(self) -> Any:
        secret = self.daemon.secret
        return build_app(MasterView(self.daemon), self.daemon.metrics_registry,
                         secret.http_token if secret is not None else None)

    def families(self) -> Iterator[Metric]:
        daemon, election = self.daemon, self.daemon.election
        yield from store_families(daemon.store)
        yield from self.rpc_counts.families()
        yield gauge("mooncake_master_leading", "1 while this master serves (always, without HA), 0 as a standby",
                    election is None or election.leading)
        if election is not None:
            yield counter("mooncake_master_elections_total", "Times this master was elected leader",
                          election.num_elected)
        yield gauge("mooncake_kv_events_sequence", "Sequence number of the last KV-event batch published",
                    daemon.kv_events.last_sequence)


class RpcCounts:
    """Requests and failures per op; for batch ops also items, failed items and partial successes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = defaultdict(int)
        self.failures: dict[str, int] = defaultdict(int)
        self.items: dict[str, int] = defaultdict(int)
        self.failed_items: dict[str, int] = defaultdict(int)
        self.partial: dict[str, int] = defaultdict(int)
        self.value_sizes = SizeHistogram(VALUE_SIZE_BUCKETS)

    def record(self, op: str, args: Any, outcome: Any, failed: bool) -> None:
        failed_items = total_items = 0
        # A commit's answer carries its items beside the next reservation.
        items = outcome.get("results") if op == "store.batch_put_commit" and isinstance(outcome, dict) else outcome
        if not failed and op.startswith("store.batch_") and isinstance(items, list):
            total_items = len(items)
            failed_items = sum(1 for item in items if isinstance(item, dict) and "error" in item)
            failed = total_items > 0 and failed_items == total_items
        with self.lock:
            self.requests[op] += 1
            self.failures[op] += failed
            if total_items:
                self.items[op] += total_items
                self.failed_items[op] += failed_items
                self.partial[op] += 0 < failed_items < total_items
        if not failed:
            self._observe_sizes(op, args, outcome)

    def _observe_sizes(self, op: str, args: Any, outcome: Any) -> None:
        if op in ("store.put_start", "store.upsert_start") and isinstance(args.get("size"), int):
            self.value_sizes.observe([args["size"]])
        elif op in ("store.batch_put_start", "store.batch_upsert_start") and isinstance(args.get("sizes"), list):
            self.value_sizes.observe([size for size, item in zip(args["sizes"], outcome)
                                      if isinstance(size, int) and isinstance(item, dict) and "ok" in item])
        elif op == "store.batch_put_commit" and isinstance(args.get("sizes"), list) and isinstance(outcome, dict):
            # Its objects' PutStart happened here: the sizes of those it published.
            self.value_sizes.observe([size for size, item in zip(args["sizes"], outcome.get("results", ()))
                                      if isinstance(size, int) and isinstance(item, dict) and "ok" in item])

    def families(self) -> Iterator[Metric]:
        with self.lock:
            requests, failures = dict(self.requests), dict(self.failures)
            items, failed_items, partial = dict(self.items), dict(self.failed_items), dict(self.partial)
        for op, stem in OFFICIAL_OPS.items():
            yield counter(f"master_{stem}_requests_total", f"Total number of {op} requests received",
                          requests.get(op, 0))
            yield counter(f"master_{stem}_failures_total", f"Total number of failed {op} requests",
                          failures.get(op, 0))
            if op.startswith("store.batch_"):
                yield counter(f"master_{stem}_items_total", f"Keys asked for by {op} requests", items.get(op, 0))
                yield counter(f"master_{stem}_failed_items_total", f"Keys of {op} requests that failed",
                              failed_items.get(op, 0))
                yield counter(f"master_{stem}_partial_successes_total",
                              f"{op} requests of which some keys failed, not all", partial.get(op, 0))
        yield self.value_sizes.family("master_value_size_bytes", "Distribution of object value sizes")
        # Every op, those without a Mooncake counterpart too (te.meta.*, cluster.*, upserts, ...).
        yield labelled_counter("mooncake_master_requests_total", "Requests answered, by op.", "op", requests)
        yield labelled_counter("mooncake_master_failures_total", "Requests answered with an error, by op.", "op",
                               failures)


class SizeHistogram:
    """A histogram that takes a whole batch's sizes under one lock: prometheus_client's
    Histogram.observe, one call per object, cost the master's I/O thread about 1.8 us per object
    of a batch put (its lock and bucket walk each time)."""

    def __init__(self, bounds: tuple[int, ...]) -> None:
        self.bounds = bounds
        self.lock = threading.Lock()
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0

    def observe(self, sizes: list[int]) -> None:
        bounds, counts = self.bounds, self.counts
        with self.lock:
            for size in sizes:
                counts[bisect_left(bounds, size)] += 1  # the first bound >= size: le is inclusive
            self.sum += sum(sizes)

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        with self.lock:
            counts, total = list(self.counts), self.sum
        cumulative, buckets = 0, []
        for bound, count in zip([*map(float, self.bounds), float("inf")], counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


class CountedOps:
    """Stands for the RPC server when ops are registered: each handler it is given is counted."""

    def __init__(self, server: Any, counts: RpcCounts) -> None:
        self.server, self.counts = server, counts

    def register(self, op: str, handler: Callable, *, blocking: bool = False) -> None:
        self.server.register(op, self._counted(op, handler), blocking=blocking)

    def _counted(self, op: str, handler: Callable) -> Callable:
        record = self.counts.record

        def run(request: Any) -> Any:
            try:
                outcome = handler(request)
            except Exception:
                record(op, request.args, None, failed=True)
                raise
            record(op, request.args, outcome, failed=False)
            return outcome
        return run


def store_families(store: Any) -> Iterator[Metric]:
    """Capacity, usage, keys, clients and the state's counters of ``store`` (a StoreService).

    Only what is O(1) or O(segments) is read under the store lock, which the RPC I/O thread
    needs for every op; the objects are counted from a copy of the table's values, off the lock
    (a scan of a million objects takes the better part of a second). An object changing during
    the count is counted as it was or as it is, as a gauge sampled a moment earlier or later."""
    now = time.monotonic()
    segments: dict[str, list[int]] = {}
    with store.lock:
        state = store.state
        capacity, used = state.capacity, state.used_bytes
        # Summed by name, as Mooncake's QuerySegments does: two live stores of one process
        # set up under the same name each mount a segment of that name.
        for segment in state.segments.values():
            total = segments.setdefault(segment.spec.name, [0, 0])
            total[0] += segment.allocator.capacity
            total[1] += segment.allocator.num_used_bytes
        objects = list(state.objects.values())
        num_segments, num_clients = len(state.segments), len(state.clients)
        num_offload_pending = len(state.offload_pending)
        stats = state.stats.as_dict()
        tenant_used, tenant_quotas = dict(state.tenants.used), dict(state.tenants.quotas)
    num_soft_pinned = sum(1 for o in objects if o.soft_pin_deadline is not None and o.soft_pin_deadline > now)
    num_hard_pinned = sum(1 for o in objects if o.hard_pinned)
    num_processing = sum(1 for o in objects if not o.complete)
    disk_bytes = sum(o.size for o in objects for r in o.replicas if not r.in_memory)
    yield gauge("master_total_capacity_bytes", "Total memory capacity across all mounted segments", capacity)
    yield gauge("master_allocated_bytes", "Total memory bytes currently allocated across all segments", used)
    yield labelled_gauge("segment_total_capacity_bytes", "Total memory capacity of the mounted segment",
                         "segment", {name: c for name, (c, _) in segments.items()})
    yield labelled_gauge("segment_allocated_bytes", "Total memory bytes currently allocated of the segment",
                         "segment", {name: u for name, (_, u) in segments.items()})
    yield gauge("master_key_count", "Total number of keys managed by the master", len(objects))
    yield gauge("master_soft_pin_key_count", "Total number of soft-pinned keys managed by the master",
                num_soft_pinned)
    yield gauge("master_active_clients", "Total number of active clients", num_clients)
    yield gauge("mooncake_master_hard_pinned_key_count", "Keys pinned until removed (never evicted)",
                num_hard_pinned)
    yield gauge("mooncake_master_processing_key_count", "Keys whose put has started and not ended", num_processing)
    yield gauge("mooncake_master_segments", "Mounted memory segments", num_segments)
    yield gauge("mooncake_master_disk_replica_bytes", "Bytes of the disk replicas store clients' SSD tiers hold",
                disk_bytes)
    yield gauge("mooncake_master_offload_pending", "Eviction victims handed to their owner to copy to disk first",
                num_offload_pending)
    tenant_keys: dict[str, int] = {}
    for obj in objects:
        tenant = tenant_of(obj.key)
        tenant_keys[tenant] = tenant_keys.get(tenant, 0) + 1
    yield labelled_gauge("mooncake_tenant_quota_charged_bytes", "Memory bytes charged to the tenant's quota "
                         "(each replica, puts in flight, copies)", "tenant_id", tenant_used)
    yield labelled_gauge("mooncake_tenant_quota_bytes", "The tenant's quota set explicitly (0 = unlimited); "
                         "others have default_tenant_quota", "tenant_id", tenant_quotas)
    yield labelled_gauge("mooncake_tenant_key_count", "Keys the tenant holds", "tenant_id", tenant_keys)
    for field, value in stats.items():
        name, documentation = OFFICIAL_STATS.get(field) or (
            f"mooncake_master_{field.removeprefix('num_')}_total",
            f"Count of {field.removeprefix('num_').replace('_', ' ')} since this master's state began.")
        yield counter(name, documentation, value)
