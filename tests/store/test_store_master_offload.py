"""offload_policy "evicted" in the master: eviction victims go to their owner's disk first.

Segment s1 (1 KiB, 64-byte slots) belongs to c1, which has an SSD tier (a disk endpoint); object
``k<i>`` of 64 bytes put into the empty segment at time i lands at slot i, with checksum i + 1.
"""

from master_helpers import base, master, put
from store.master_state import MasterState
from store.objects import ReplicateConfig, ReplicaTier, Segment


def full(**policy) -> MasterState:
    """s1 filled with k0..k15, least recently used first."""
    m = master(**{"client_ttl": 10.0, **policy})
    m.mount_segment("c1", Segment("s1", "seg1", base(1), 1024, "ep1", "h1", "disk1"), now=0.0)
    for i in range(16):
        m.put_start("c1", f"k{i}", 64, float(i), ReplicateConfig(hard_pin=(i == 0)))
        m.put_end("c1", f"k{i}", float(i), i + 1)
    return m


def handed_over(m: MasterState) -> list[tuple[str, int]]:
    return [(c.key, c.address) for c in m.journal.since("s1", 0) if c.kind == "offload"]


def tiers(m: MasterState, key: str) -> list[ReplicaTier]:
    return [r.tier for r in m.objects[key].replicas]


def test_victims_are_handed_to_the_owner_and_freed_only_once_copied():
    m = full(high_watermark=0.5, eviction_ratio=0.25)
    m.get_replica_list("k1", now=16.0)  # leased until 26: not a victim
    # 1 KiB used, target 256 bytes: 12 victims in LRU order, past the hard-pinned k0 and leased k1.
    assert m.evict(now=16.0) == []
    victims = [f"k{i}" for i in range(2, 14)]
    assert handed_over(m) == [(k, base(1) + 64 * int(k[1:])) for k in victims]
    assert list(m.offload_pending) == victims and m.used_bytes == 1024
    assert m.evict(now=17.0) == [] and len(handed_over(m)) == 12  # pending counts as freed

    m.add_disk_replica("c1", "k2", "s1", base(1) + 128, 3, now=18.0)
    assert tiers(m, "k2") == [ReplicaTier.DISK] and m.used_bytes == 1024 - 64
    assert "k2" not in m.offload_pending and m.stats.num_evicted_to_disk == 1

    # The owner copied nothing else within client_ttl of the hand-over: freed without a copy.
    assert m.evict(now=25.9) == []
    assert m.evict(now=26.0) == victims[1:]
    assert m.stats.num_offload_timeouts == 11 and not m.offload_pending
    assert sorted(m.objects) == sorted(["k0", "k1", "k2", "k14", "k15"])


def test_a_read_takes_a_victim_back_and_a_late_copy_is_kept_beside_memory():
    m = full(high_watermark=0.95, eviction_ratio=0.0)
    assert m.evict(now=16.0) == [] and list(m.offload_pending) == ["k1"]
    m.get_replica_list("k1", now=17.0)
    assert not m.offload_pending
    m.add_disk_replica("c1", "k1", "s1", base(1) + 64, 2, now=18.0)
    assert tiers(m, "k1") == [ReplicaTier.MEMORY, ReplicaTier.DISK] and m.used_bytes == 1024


def test_a_put_never_waits_for_an_owner():
    m = full()
    m.add_disk_replica("c1", "k7", "s1", base(1) + 7 * 64, 8, now=16.0)
    # Objects with a disk copy go first, even before older ones that could still be copied ...
    put(m, "new", 64, now=17.0)  # no checksum: not offloadable, so evicted first next time
    assert tiers(m, "k7") == [ReplicaTier.DISK] and tiers(m, "k1") == [ReplicaTier.MEMORY]
    # ... and with none left, the LRU object goes without a copy, pending or not.
    assert m.evict(now=17.0) == [] and list(m.offload_pending) == ["k1", "k2", "k3"]
    m.put_start("c1", "new2", 64, now=18.0)
    m.put_end("c1", "new2", now=18.0, checksum=99)
    assert "new" not in m.objects and list(m.offload_pending) == ["k1", "k2", "k3"]
    put(m, "new3", 64, now=19.0)
    assert "k1" not in m.objects and list(m.offload_pending) == ["k2", "k3"]
    assert tiers(m, "k2") == [ReplicaTier.MEMORY]


def test_policy_all_and_owners_without_a_disk_evict_at_once():
    m = full(high_watermark=0.95, eviction_ratio=0.0, offload_policy="all")
    assert m.evict(now=16.0) == ["k1"] and not handed_over(m)
    m = master(high_watermark=0.95, eviction_ratio=0.0)
    m.mount_segment("c1", Segment("s1", "seg1", base(1), 1024, "ep1", "h1"), now=0.0)
    for i in range(16):
        m.put_start("c1", f"k{i}", 64, float(i))
        m.put_end("c1", f"k{i}", float(i), i + 1)
    assert m.evict(now=16.0) == ["k0"] and not m.offload_pending
