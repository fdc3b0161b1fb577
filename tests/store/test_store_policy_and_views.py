"""The policy dataclass against the settings registry, and the plain-dict views `inspect` shows."""

import msgpack
import pytest

from master_helpers import mounted, put
from store.errors import InvalidParams, ObjectNotFound
from store.policy import StorePolicy
from store.views import clients_view, counters_view, object_view, objects_view, segments_view
from transfer.settings import resolve


def test_the_registry_defaults_are_the_policy_defaults():
    assert StorePolicy.from_config(resolve(environ={})) == StorePolicy()


def test_settings_reach_the_policy():
    config = resolve(flags={"lease_ttl": "5s", "allocation_strategy": "local_first"},
                     environ={"MOONCAKE_HIGH_WATERMARK": "0.8"})
    policy = StorePolicy.from_config(config)
    assert (policy.lease_ttl, policy.allocation_strategy, policy.high_watermark) == (5.0, "local_first", 0.8)
    assert StorePolicy.from_config({"client_ttl": 3.0}).client_ttl == 3.0


@pytest.mark.parametrize("bad", [{"allocation_strategy": "nearest"}, {"high_watermark": 0.0},
                                 {"high_watermark": 1.5}, {"eviction_ratio": -0.1},
                                 {"lease_ttl": -1.0}, {"max_soft_pin_ttl": 60.0}])
def test_impossible_policies_are_refused(bad):
    with pytest.raises(InvalidParams):
        StorePolicy(**bad)


def test_views_are_plain_data_that_msgpack_carries():
    m = mounted(2)
    put(m, "a", 100, now=0.0, replica_num=2, hard_pin=True)
    put(m, "b", 64, now=1.0, soft_pin=True, soft_pin_ttl=60.0, preferred_segments=("s1",))
    m.put_start("c2", "w", 64, now=2.0)
    m.get_replica_list("a", now=3.0)
    now = 4.0
    views = [counters_view(m), segments_view(m), objects_view(m, now, "default"), clients_view(m, now)]
    assert msgpack.unpackb(msgpack.packb(views)) == views

    counters = counters_view(m)
    assert counters["num_objects"] == 3 and counters["num_segments"] == 2
    assert counters["used_bytes"] == 128 * 2 + 64 + 64 and counters["capacity_bytes"] == 2048
    s1 = next(row for row in segments_view(m) if row["segment_id"] == "s1")
    assert s1["client_id"] == "c1" and s1["free_ratio"] == pytest.approx(1 - s1["used_bytes"] / 1024)
    a = object_view(m, "a", now)
    assert (a["state"], a["hard_pinned"], a["lease_left"], a["idle"]) == ("COMPLETE", True, 9.0, 1.0)
    assert sorted(r["segment_id"] for r in a["replicas"]) == ["s1", "s2"]
    b = object_view(m, "b", now)
    assert (b["soft_pin_left"], b["lease_left"]) == (57.0, 0.0)
    w = object_view(m, "w", now)
    assert (w["state"], w["idle"], w["replicas"][0]["status"]) == ("PROCESSING", None, "PROCESSING")
    c2 = next(row for row in clients_view(m, now) if row["client_id"] == "c2")
    assert c2 == {"client_id": "c2", "registered": True, "last_seen_ago": 2.0, "segments": ["s2"],
                  "num_puts_in_flight": 1}
    with pytest.raises(ObjectNotFound):
        object_view(m, "zzz", now)
