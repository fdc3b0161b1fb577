"""Reads, leases, existence probes, removal and pins."""

import pytest

from master_helpers import base, mounted, put
from store.errors import ObjectHasLease, ObjectNotFound, ReplicaIsNotReady
from store.objects import ReplicaDescriptor, ReplicaList, ReplicateConfig


def test_a_get_grants_a_lease_that_blocks_remove_until_it_ends():
    m = mounted(1, lease_ttl=10.0)
    put(m, "k", 64, now=0.0)
    m.get_replica_list("k", now=1.0)
    with pytest.raises(ObjectHasLease) as info:
        m.remove("k", now=10.9)
    assert info.value.code == -706
    m.remove("k", now=11.0)  # the lease ended at 1 + 10
    assert not m.exists("k") and m.used_bytes == 0 and m.stats.num_removed == 1


def test_a_put_and_a_get_describe_the_replica_field_for_field():
    """The master builds its answers from every field (store.objects.tuple_of): each must be the
    named tuple its constructor makes, defaults included, so a field added later cannot go missing."""
    m = mounted(1, lease_ttl=10.0)
    replica = ReplicaDescriptor("s1", "seg1", "ep1", "h1", base(1), 64)
    assert put(m, "k", 64, now=0.0) == [replica]
    answer = m.get_replica_list("k", now=1.0)
    assert answer == ReplicaList("k", 64, [replica], 10.0, None, False)
    assert type(answer) is ReplicaList and type(answer.replicas[0]) is ReplicaDescriptor
    assert len(answer) == len(ReplicaList._fields) and len(answer.replicas[0]) == len(ReplicaDescriptor._fields)


def test_leases_only_grow_and_a_forced_remove_ignores_them():
    m = mounted(1, lease_ttl=10.0)
    put(m, "k", 64, now=0.0)
    m.get_replica_list("k", now=5.0)
    m.get_replica_list("k", now=2.0)  # a late reply does not shorten the lease
    assert m.objects["k"].lease_deadline == 15.0
    m.remove("k", now=6.0, force=True)
    assert "k" not in m.objects and m.stats.num_leases_granted == 2


def test_exists_grants_no_lease():
    m = mounted(1)
    put(m, "k", 64, now=0.0)
    assert m.exists("k")
    m.remove("k", now=0.5)
    assert not m.exists("k")


def test_get_and_remove_of_a_missing_key_are_not_found():
    m = mounted(1)
    with pytest.raises(ObjectNotFound):
        m.get_replica_list("k", now=0.0)
    with pytest.raises(ObjectNotFound):
        m.remove("k", now=0.0)


def test_an_object_being_written_cannot_be_removed_even_by_force():
    m = mounted(1)
    m.put_start("c1", "k", 64, now=0.0)
    with pytest.raises(ReplicaIsNotReady):
        m.remove("k", now=1.0, force=True)


def test_a_hard_pinned_object_can_still_be_removed_explicitly():
    m = mounted(1)
    put(m, "k", 64, now=0.0, hard_pin=True)
    m.remove("k", now=1.0)
    assert not m.exists("k")


def test_remove_all_skips_leased_and_in_flight_objects_unless_forced():
    m = mounted(1)
    for key in ("a", "b", "c"):
        put(m, key, 64, now=0.0)
    m.put_start("c1", "writing", 64, now=0.0)
    m.get_replica_list("b", now=1.0)
    assert m.remove_all(now=2.0) == 2
    assert sorted(m.objects) == ["b", "writing"]
    assert m.remove_all(now=2.0, force=True) == 1
    assert sorted(m.objects) == ["writing"] and m.stats.num_removed == 3


def test_batch_remove_answers_per_key():
    m = mounted(1)
    put(m, "a", 64, now=0.0)
    put(m, "b", 64, now=0.0)
    m.get_replica_list("b", now=0.0)
    results = m.batch_remove(["a", "b", "zzz"], now=1.0)
    assert results[0] is None
    assert isinstance(results[1], ObjectHasLease) and isinstance(results[2], ObjectNotFound)
    assert m.batch_remove(["b"], now=1.0, force=True) == [None]


def test_a_soft_pin_lasts_its_ttl_from_completion_and_reads_do_not_extend_it():
    m = mounted(1, soft_pin_ttl=1800.0, max_soft_pin_ttl=3600.0)
    m.put_start("c1", "default", 64, now=0.0, config=ReplicateConfig(soft_pin=True))
    m.put_end("c1", "default", now=100.0)
    assert m.objects["default"].soft_pin_deadline == 1900.0
    m.get_replica_list("default", now=1000.0)
    assert m.objects["default"].soft_pin_deadline == 1900.0
    put(m, "short", 64, now=0.0, soft_pin=True, soft_pin_ttl=60.0)
    assert m.objects["short"].soft_pin_deadline == 60.0
    put(m, "greedy", 64, now=0.0, soft_pin=True, soft_pin_ttl=10 * 3600.0)
    assert m.objects["greedy"].soft_pin_deadline == 3600.0  # cut to the maximum
    put(m, "plain", 64, now=0.0, soft_pin_ttl=60.0)  # a TTL without soft_pin pins nothing
    assert m.objects["plain"].soft_pin_deadline is None
