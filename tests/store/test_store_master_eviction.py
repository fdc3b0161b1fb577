"""Eviction: exact LRU order, what is never evicted, and the full-pool put path.

Segments are 1 KiB with 64-byte alignment: 16 slots, so object ``k<i>`` of 64 bytes put into an
empty segment lands at slot i.
"""

import random

import pytest

from master_helpers import base, master, mounted, put, segment, where
from store.errors import NoAvailableHandle


def fill(m, n=16, pins=None, client="c1", **config):
    """Put k0..k<n-1> (64 bytes) at times 0..n-1; ``pins`` maps index -> extra ReplicateConfig."""
    for i in range(n):
        put(m, f"k{i}", 64, now=float(i), client=client, **{**config, **(pins or {}).get(i, {})})


def test_a_put_into_a_full_pool_evicts_the_least_recently_used_objects_first():
    m = mounted(1)
    fill(m)
    m.get_replica_list("k0", now=20.0)  # k0 is now the most recently used (and leased)
    replicas = m.put_start("c1", "new", 128, now=21.0)
    assert where(replicas) == [("s1", base(1) + 64)]  # where k1 and k2 were
    assert "k1" not in m.objects and "k2" not in m.objects
    assert m.stats.num_evicted == 2 and len(m.objects) == 15


def test_a_fragmented_pool_keeps_evicting_in_lru_order_until_a_range_fits():
    m = mounted(1)
    fill(m)
    m.get_replica_list("k0", now=20.0)
    m.get_replica_list("k2", now=20.0)  # leased: k1 and k3 go first, but they are not adjacent
    replicas = m.put_start("c1", "new", 128, now=21.0)
    assert where(replicas) == [("s1", base(1) + 3 * 64)]  # k3 + k4 made the first 128-byte range
    assert {"k1", "k3", "k4"}.isdisjoint(m.objects) and "k5" in m.objects
    assert m.stats.num_evicted == 3
    assert m.segments["s1"].allocator.num_free_bytes == 64  # k1's slot, too small, stays free


def test_exists_does_not_count_as_a_use_but_a_get_does():
    m = mounted(1, lease_ttl=1.0)
    fill(m)
    assert m.exists("k0")
    put(m, "a", 64, now=20.0)
    assert "k0" not in m.objects
    m.get_replica_list("k1", now=21.0)  # leased until 22, and moved to the back of the LRU
    put(m, "b", 64, now=30.0)
    assert "k1" in m.objects and "k2" not in m.objects


def test_hard_pinned_and_leased_objects_are_never_evicted():
    m = mounted(1)
    fill(m, n=8, hard_pin=True)
    for i in range(8):
        put(m, f"r{i}", 64, now=10.0 + i)
    for i in range(8):
        m.get_replica_list(f"r{i}", now=20.0)
    with pytest.raises(NoAvailableHandle):
        m.put_start("c1", "new", 64, now=21.0)
    assert len(m.objects) == 16 and m.stats.num_evicted == 0
    assert m.stats.num_allocation_failures == 1
    put(m, "new", 64, now=30.0)  # the leases ended at 30: r0, the oldest read, goes
    assert "r0" not in m.objects


def test_soft_pinned_objects_are_evicted_only_after_every_unpinned_one():
    m = mounted(1)
    fill(m, pins={i: {"soft_pin": True} for i in range(8)})
    put(m, "a", 64, now=20.0)
    assert "k8" not in m.objects  # the oldest unpinned one
    assert all(f"k{i}" in m.objects for i in range(8))
    for i in range(9, 16):
        m.remove(f"k{i}", now=21.0)
    for j in range(7):
        put(m, f"b{j}", 64, now=22.0 + j)  # fills the 7 freed slots without evicting
    m.get_replica_list("a", now=23.0)
    for j in range(7):
        m.get_replica_list(f"b{j}", now=23.0)
    put(m, "c", 64, now=24.0)  # only soft-pinned objects are unleased: the oldest goes
    assert "k0" not in m.objects and "k1" in m.objects


def test_soft_pinned_objects_are_kept_when_the_policy_forbids_evicting_them():
    m = mounted(1, allow_evict_soft_pinned=False)
    fill(m, soft_pin=True)
    with pytest.raises(NoAvailableHandle):
        m.put_start("c1", "new", 64, now=20.0)
    assert len(m.objects) == 16


def test_an_expired_soft_pin_no_longer_protects():
    m = mounted(1)
    fill(m, pins={0: {"soft_pin": True, "soft_pin_ttl": 5.0}, 1: {"soft_pin": True}})
    put(m, "new", 64, now=20.0)  # k0's pin ended at 5
    assert "k0" not in m.objects and "k1" in m.objects


def test_watermark_eviction_frees_down_to_eviction_ratio_below_the_watermark_in_exact_order():
    m = mounted(1, high_watermark=0.75, eviction_ratio=0.25)
    fill(m, n=13, pins={1: {"soft_pin": True}, 2: {"hard_pin": True}})
    m.get_replica_list("k3", now=20.0)
    assert m.used_bytes == 832  # above 768
    # Target 768 - 256 = 512 bytes: five objects go, skipping soft k1, hard k2 and leased k3.
    assert m.evict(now=21.0) == ["k0", "k4", "k5", "k6", "k7"]
    assert m.used_bytes == 512 and m.stats.num_evicted == 5
    assert m.evict(now=22.0) == []


def test_watermark_eviction_takes_soft_pinned_objects_last():
    m = mounted(1, high_watermark=0.5, eviction_ratio=0.0)
    fill(m, n=12, pins={i: {"soft_pin": True} for i in range(10)})
    # 768 used, watermark 512: four go, the two unpinned ones first, then the oldest soft pins.
    assert m.evict(now=20.0) == ["k10", "k11", "k0", "k1"]


def test_a_put_that_had_to_evict_makes_the_next_evict_free_headroom():
    m = mounted(1, high_watermark=1.0, eviction_ratio=0.25)
    fill(m)
    assert m.evict(now=16.0) == []  # full is not above a watermark of 1.0
    put(m, "new", 64, now=17.0)
    assert "k0" not in m.objects
    assert m.evict(now=18.0) == ["k1", "k2", "k3", "k4"]  # 25 % of 1 KiB
    assert m.evict(now=19.0) == []


def test_eviction_for_a_second_replica_only_touches_segments_the_object_may_still_use():
    m = mounted(2)
    fill(m, preferred_segments=("s1",))
    put(m, "on2", 64, now=16.0, preferred_segments=("s2",))
    replicas = put(m, "new", 64, now=17.0, replica_num=2, preferred_segments=("s2", "s1"))
    assert where(replicas) == [("s2", base(2) + 64), ("s1", base(1))]
    assert "k0" not in m.objects and "on2" in m.objects and m.stats.num_evicted == 1


@pytest.mark.parametrize("seed", range(4))
def test_a_pool_full_of_evictable_objects_never_fails_a_put(seed):
    rng = random.Random(seed)
    m = master(seed=seed)
    for i in (1, 2, 3):
        m.mount_segment(f"c{i}", segment(i, 4096), now=0.0)
    for step in range(300):
        now = float(step)
        put(m, f"o{step}", rng.choice([1, 64, 200, 1000, 4096]), now=now,
            client=f"c{rng.randint(1, 3)}", replica_num=rng.randint(1, 3))
        if step % 7 == 0:
            m.evict(now)
        for s in m.segments.values():
            s.allocator.check_invariants()
    assert m.stats.num_allocation_failures == 0 and m.stats.num_evicted > 0
    assert f"o{299}" in m.objects
