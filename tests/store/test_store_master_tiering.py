"""The SSD tier in the master: disk replicas survive eviction, promotion, and a dead owner.

Segments are 1 KiB with 64-byte alignment; object ``k<i>`` of 64 bytes put into an empty
segment lands at slot i. Client c1 owns segment s1 and writes its objects to disk.
"""

import pytest

from master_helpers import base, mounted, put, segment
from store.errors import IllegalClient, InvalidParams
from store.objects import ReplicateConfig, ReplicaTier, ReportedObject


def stored(m, key, now=0.0, checksum=7):
    """A complete 64-byte object on s1, with a checksum (only those are offloaded)."""
    m.put_start("c1", key, 64, now, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", key, now, checksum)


def offloaded(m, key, address, checksum=7, now=1.0):
    m.add_disk_replica("c1", key, "s1", address, checksum, now)


def test_an_evicted_object_with_a_disk_replica_stays_readable_from_disk_only():
    m = mounted(1)
    stored(m, "k0")
    offloaded(m, "k0", base(1))
    assert m._evict([m.objects["k0"]]) == ["k0"]
    listed = m.get_replica_list("k0", now=2.0)
    assert [(r.tier, r.endpoint, r.address) for r in listed.replicas] == [(ReplicaTier.DISK.value, "", 0)]
    assert m.segments["s1"].allocator.num_used_bytes == 0  # its memory is free
    assert "k0" not in m.lru and m.stats.num_evicted_to_disk == 1
    assert not listed.promote  # one disk read so far


def test_a_disk_report_is_refused_unless_the_memory_replica_still_holds_that_object():
    m = mounted(2)
    stored(m, "k0")
    with pytest.raises(InvalidParams):
        offloaded(m, "k0", base(1), checksum=8)  # overwritten since: another checksum
    with pytest.raises(InvalidParams):
        offloaded(m, "k0", base(1) + 64)  # not where the object is
    with pytest.raises(IllegalClient):
        m.add_disk_replica("c2", "k0", "s1", base(1), 7, 1.0)  # not c2's segment
    offloaded(m, "k0", base(1))
    offloaded(m, "k0", base(1))  # a retried report adds nothing
    assert [r.tier for r in m.objects["k0"].replicas] == [ReplicaTier.MEMORY, ReplicaTier.DISK]


def test_two_reads_from_disk_ask_for_promotion_and_the_new_memory_replica_is_read_first():
    m = mounted(1)
    stored(m, "k0")
    offloaded(m, "k0", base(1))
    m._evict([m.objects["k0"]])
    assert not m.get_replica_list("k0", now=2.0).promote
    assert m.get_replica_list("k0", now=3.0).promote
    replica = m.promote_start("c2", "k0", now=3.0)
    assert m.objects["k0"].complete  # readers still see the disk replica meanwhile
    with pytest.raises(IllegalClient):
        m.promote_end("c3", "k0", now=3.0)
    m.promote_end("c2", "k0", now=3.0)
    listed = m.get_replica_list("k0", now=4.0)
    assert [(r.tier, r.address) for r in listed.replicas] == [
        (ReplicaTier.MEMORY.value, replica.address), (ReplicaTier.DISK.value, 0)]
    assert not listed.promote and "k0" in m.lru and m.stats.num_promoted == 1


def test_a_full_pool_evicts_to_disk_and_remove_reaches_disk_only_objects():
    m = mounted(1)
    for i in range(16):
        stored(m, f"k{i}", now=float(i), checksum=i + 1)
        offloaded(m, f"k{i}", base(1) + 64 * i, checksum=i + 1, now=float(i))
    put(m, "new", 128, now=20.0)
    assert [r.tier for r in m.objects["k0"].replicas] == [ReplicaTier.DISK]
    m.remove("k0", now=21.0)
    assert "k0" not in m.objects
    assert ("disk_gone", "k0") in [(c.kind, c.key) for c in m.journal.since("s1", 0)]
    assert m.remove_all(now=21.0) == 16


def test_a_dead_owner_takes_its_disk_replicas_along():
    m = mounted(2, client_ttl=10.0)
    stored(m, "k0")
    offloaded(m, "k0", base(1))
    m._evict([m.objects["k0"]])
    m.ping("c2", now=15.0)
    assert m.expire_clients(now=15.0) == ["c1"]
    assert "k0" not in m.objects


def test_a_restarted_master_adopts_reported_disk_replicas_unless_another_object_holds_the_key():
    m = mounted(2)
    m.put_start("c2", "mem", 64, 0.0, ReplicateConfig(preferred_segments=("s2",)))
    m.put_end("c2", "mem", 0.0, 5)
    disk = [ReportedObject("only-disk", "s1", 0, 64, 9), ReportedObject("mem", "s1", 0, 64, 5),
            ReportedObject("mem2", "s1", 0, 64, None), ReportedObject("other", "s1", 0, 64, 4)]
    m.put_start("c2", "other", 128, 0.0, ReplicateConfig(preferred_segments=("s2",)))
    m.put_end("c2", "other", 0.0, 4)
    answer = m.remount("c1", [segment(1)], [], now=1.0, disk_objects=disk)
    # No checksum: nothing to check a read against. "other" is another object now (128 bytes).
    assert answer["disk_rejected"] == ["mem2", "other"]
    assert tiers(m, "only-disk") == [ReplicaTier.DISK] and "only-disk" not in m.lru
    assert tiers(m, "mem") == [ReplicaTier.MEMORY, ReplicaTier.DISK]
    listed = m.get_replica_list("only-disk", now=2.0)
    assert [(r.tier, r.segment_id) for r in listed.replicas] == [(ReplicaTier.DISK.value, "s1")]
    assert m.remount("c1", [segment(1)], [], now=3.0, disk_objects=disk[:1])["disk_rejected"] == []
    assert tiers(m, "only-disk") == [ReplicaTier.DISK]  # a repeated report adds nothing


def tiers(m, key):
    return [r.tier for r in m.objects[key].replicas]
