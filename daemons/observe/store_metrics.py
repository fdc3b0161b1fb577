"""Series of a daemon that owns a store client: the segment it contributes (the store-client
daemon's, a prefill worker's instance-local KV cache) and the puts and gets it made itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from daemons.observe.metrics import counter, gauge
from store.client import StoreClient


def client_families(client: StoreClient) -> Iterator[Any]:
    stats = client.stats.as_dict()
    yield counter("mooncake_store_client_puts_total", "Objects this daemon's store client put", stats["num_puts"])
    yield counter("mooncake_store_client_put_errors_total", "Keys whose put by this daemon failed",
                  stats["num_put_errors"])
    # Mooncake's client names these two so, without _total.
    yield counter("mooncake_transfer_write_bytes", "Bytes this daemon's store client put", stats["num_put_bytes"])
    yield counter("mooncake_store_client_gets_total", "Objects this daemon's store client read", stats["num_gets"])
    yield counter("mooncake_store_client_get_errors_total", "Keys whose read by this daemon failed (missing too)",
                  stats["num_get_errors"])
    yield counter("mooncake_transfer_read_bytes", "Bytes this daemon's store client read", stats["num_get_bytes"])
    yield counter("mooncake_store_client_lease_reuses_total",
                  "Of its reads, those made through a read lease held from an earlier get, without "
                  "asking the master", stats["num_lease_reuses"])
    owner = client.owner
    if owner is None:
        return
    # The owner's record of the complete objects in its segment, as the master's pings told it;
    # written by the main thread's tick, read here from the HTTP thread: copy before summing.
    objects = list(owner.record.values())
    yield gauge("mooncake_store_client_segment_capacity_bytes", "Bytes of the segment this daemon contributes",
                owner.segment.size)
    yield gauge("mooncake_store_client_segment_used_bytes",
                "Bytes of complete objects in its segment (as of the last ping)", sum(o.size for o in objects))
    yield gauge("mooncake_store_client_segment_objects", "Complete objects in its segment (as of the last ping)",
                len(objects))
    yield gauge("mooncake_store_client_disk_objects", "Objects it holds on its SSD tier", len(owner.disk_record))
    yield counter("mooncake_store_client_remounts_total", "Times it re-mounted its segment (the master forgot it)",
                  owner.num_remounts)
    yield counter("mooncake_store_client_offloaded_total", "Objects it copied to its SSD tier", owner.num_offloaded)
