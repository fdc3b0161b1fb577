"""Replica copies and moves in the master (store.replication).

Segments are 1 KiB with 64-byte alignment; client ci owns segment si. Object "k" of 64 bytes is
put on s1 (slot 0) by c1; c9 is the client that copies it.
"""

import pytest

from master_helpers import base, mounted, put
from store.errors import IllegalClient, InvalidParams, NoAvailableHandle, ObjectHasLease, ObjectNotFound


def stored(n: int = 3, **policy):
    m = mounted(n, **policy)
    put(m, "k", 64, 0.0, preferred_segments=("s1",), replica_num=1)
    return m


def segments_of(m, key="k"):
    return [r.segment_id for r in m.objects[key].replicas]


def test_a_copy_publishes_its_replicas_only_at_its_end():
    m = stored()
    plan = m.copy_start("c9", "k", ["s2", "s3"], 1.0)
    assert [s.segment_id for s in plan["sources"]] == ["s1"]
    assert [(t.segment_id, t.address) for t in plan["targets"]] == [("s2", base(2)), ("s3", base(3))]
    # Meanwhile readers see the old replica only, and the object stays complete.
    assert [r.segment_id for r in m.get_replica_list("k", 1.0).replicas] == ["s1"]
    m.copy_end("c9", "k", 1.5)
    assert segments_of(m) == ["s1", "s2", "s3"] and m.stats.num_copies == 1
    assert m.objects["k"].complete and not m.objects["k"].copying


def test_a_target_that_holds_the_object_already_is_skipped():
    m = stored()
    assert [t.segment_id for t in m.copy_start("c9", "k", ["s1", "s2", "s2"], 1.0)["targets"]] == ["s2"]


def test_a_move_drops_the_source_in_the_same_step_but_not_under_a_readers_lease():
    m = stored(lease_ttl=1.0)
    m.copy_start("c9", "k", ["s2"], 0.0)
    m.get_replica_list("k", 0.5)  # a reader may be copying from s1 until 1.5
    with pytest.raises(ObjectHasLease):
        m.copy_end("c9", "k", 1.0, drop_segment="s1")
    assert segments_of(m) == ["s1"]  # nothing changed: the copier may end again later
    m.copy_end("c9", "k", 2.0, drop_segment="s1")
    assert segments_of(m) == ["s2"]
    assert m.segments["s1"].allocator.num_used_bytes == 0


def test_a_move_never_drops_the_last_replica():
    m = stored()
    m.copy_start("c9", "k", ["s1"], 1.0)  # the only target holds it: nothing to write
    with pytest.raises(InvalidParams):
        m.copy_end("c9", "k", 1.0, drop_segment="s1")


def test_a_source_that_went_during_the_copy_fails_it_and_frees_the_targets():
    m = stored()
    m.copy_start("c9", "k", ["s2"], 1.0)
    m.remove("k", 1.0)  # no lease: the copier takes none
    put(m, "k", 64, 1.0, preferred_segments=("s1",), replica_num=1)  # same range again
    with pytest.raises(ObjectNotFound):
        m.copy_end("c9", "k", 1.0)
    assert segments_of(m) == ["s1"] and m.segments["s2"].allocator.num_used_bytes == 0


def test_an_overwrite_or_an_unmounted_target_abandons_the_copy():
    m = stored()
    m.copy_start("c9", "k", ["s2", "s3"], 1.0)
    m.upsert_start("c1", "k", 64, 1.0)
    assert m.segments["s2"].allocator.num_used_bytes == 0
    with pytest.raises(ObjectNotFound):
        m.copy_end("c9", "k", 1.0)
    m.put_end("c1", "k", 1.0)
    m.copy_start("c9", "k", ["s2", "s3"], 2.0)
    m.unmount_segment("c2", "s2", 2.0)
    assert m.segments["s3"].allocator.num_used_bytes == 0
    with pytest.raises(ObjectNotFound):
        m.copy_end("c9", "k", 2.0)


def test_bad_copies_are_refused_before_anything_is_allocated():
    m = stored(2)
    with pytest.raises(InvalidParams):
        m.copy_start("c9", "k", [], 1.0)
    with pytest.raises(InvalidParams):
        m.copy_start("c9", "k", ["nowhere"], 1.0)
    with pytest.raises(ObjectNotFound):
        m.copy_start("c9", "missing", ["s2"], 1.0)
    put(m, "big", 1024, 1.0, preferred_segments=("s2",), replica_num=1)  # s2 is full
    with pytest.raises(NoAvailableHandle):
        m.copy_start("c9", "k", ["s2"], 1.0)
    m.copy_start("c9", "k", ["s1"], 1.0)
    with pytest.raises(InvalidParams):
        m.copy_start("c8", "k", ["s2"], 1.0)  # one copy at a time
    with pytest.raises(IllegalClient):
        m.copy_end("c8", "k", 1.0)


def test_a_silent_copier_is_dropped_with_its_copy():
    m = stored(client_ttl=5.0)
    m.copy_start("c9", "k", ["s2"], 1.0)
    for i in (1, 2, 3):
        m.ping(f"c{i}", 7.0)
    assert "c9" in m.expire_clients(7.0)
    assert not m.objects["k"].copying and m.segments["s2"].allocator.num_used_bytes == 0
