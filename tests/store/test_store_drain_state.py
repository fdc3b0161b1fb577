"""Draining a segment in the master (store.drain.state), with no daemon.

Segments are 1 KiB with 64-byte alignment; client ci owns segment si; "d" and "e" are drainers.
"""

import pytest

from master_helpers import mounted, put
from store.errors import IllegalClient, InvalidParams, NoAvailableHandle, SegmentNotFound
from store.objects import ReplicateConfig


def segments_of(m, key):
    return sorted(r.segment_id for r in m.objects[key].replicas)


def move(m, key, now, segment="s1", drainer="d"):
    """One object moved off ``segment`` as the drainer does it (the bytes are not modelled)."""
    target = m.drain_move_start(drainer, segment, key, now)["targets"][0].segment_id
    m.copy_end(drainer, key, now, drop_segment=segment)
    return target


def test_a_drain_moves_what_is_held_only_there_and_the_owner_is_told_to_unmount():
    m = mounted(3, lease_ttl=1.0)
    put(m, "only", 64, 0.0, preferred_segments=("s1",))
    put(m, "both", 64, 0.0, preferred_segments=("s1", "s2"), replica_num=2)
    put(m, "other", 64, 0.0, preferred_segments=("s2",))
    plan = m.drain_start("d", "s1", 1.0)
    assert (plan.num_only_here, plan.bytes_only_here, plan.num_elsewhere, plan.num_in_flight) == (1, 64, 1, 0)
    assert plan.free_elsewhere == 2 * 1024 - 2 * 64  # "both" and "other" on s2
    assert m.drain_pending("d", "s1", 1.0, 10).to_move == ["only"]

    assert move(m, "only", 1.1) in ("s2", "s3")
    assert segments_of(m, "only") != ["s1"] and len(m.objects["only"].replicas) == 1
    pending = m.drain_pending("d", "s1", 1.2, 10)
    assert (pending.to_move, pending.in_flight, pending.num_only_here) == ([], [], 0)

    assert m.segments_to_unmount("c1", 1.2) == []  # still draining
    finish = m.drain_finish("d", "s1", 1.2)
    assert (finish.num_dropped, finish.unmount_in) == (1, 0.0)
    assert segments_of(m, "both") == ["s2"] and m.segments["s1"].allocator.num_used_bytes == 0
    assert m.drain_status("d", "s1", 1.2).phase == "finishing"
    assert m.segments_to_unmount("c1", 1.2) == ["s1"] and m.segments_to_unmount("c2", 1.2) == []

    assert m.unmount_segment("c1", "s1", 1.3) == []  # nothing lost
    assert m.drain_status("d", "s1", 1.3).phase == "unmounted"
    m.expire_drains(1.3)
    assert m.drains == {}
    assert all(m.objects[k].complete for k in ("only", "both", "other"))


def test_a_draining_segment_takes_no_new_replica():
    m = mounted(3)
    put(m, "old", 64, 0.0, preferred_segments=("s1",))
    m.drain_start("d", "s1", 1.0)
    # A put that prefers it, a put of many replicas, a copy to it, and an upsert of an object held
    # there all go elsewhere.
    put(m, "new", 64, 1.0, preferred_segments=("s1",))
    assert "s1" not in segments_of(m, "new")
    put(m, "wide", 64, 1.0, replica_num=3)
    assert segments_of(m, "wide") == ["s2", "s3"]
    with pytest.raises(InvalidParams, match="being drained"):
        m.copy_start("c9", "wide", ["s1"], 1.0)
    m.upsert_start("c1", "old", 64, 1.0, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", "old", 1.0)
    assert "s1" not in segments_of(m, "old")
    assert m.segments["s1"].allocator.num_used_bytes == 0  # the old bytes were dropped, not overwritten


def test_leases_never_hold_a_drain_up_but_the_unmount_waits_for_them():
    m = mounted(2, lease_ttl=1.0)
    put(m, "read", 64, 0.0, preferred_segments=("s1",))
    put(m, "shared", 64, 0.0, preferred_segments=("s1", "s2"), replica_num=2)
    m.get_replica_list("read", 2.0)  # a reader may copy from s1 until 3.0
    m.get_replica_list("shared", 2.2)  # ... and from "shared"'s replica there until 3.2
    m.drain_start("d", "s1", 2.3)
    move(m, "read", 2.4)  # a move off any other segment would be refused (OBJECT_HAS_LEASE)
    assert segments_of(m, "read") == ["s2"]
    finish = m.drain_finish("d", "s1", 2.5)
    assert finish.unmount_in == pytest.approx(0.7)
    # Nothing new lands on the freed ranges while the readers may still copy from them ...
    put(m, "later", 64, 2.6, preferred_segments=("s1",))
    assert segments_of(m, "later") == ["s2"]
    # ... and the owner is told to unmount only once the last lease ran out.
    assert m.segments_to_unmount("c1", 3.1) == []
    assert m.segments_to_unmount("c1", 3.2) == ["s1"]


def test_an_unknown_segment_or_too_little_room_elsewhere_is_refused_and_changes_nothing():
    m = mounted(2)
    with pytest.raises(SegmentNotFound, match="'nope' is not mounted .mounted: s1, s2"):
        m.drain_start("d", "nope", 0.0)
    for i in range(10):  # 640 bytes held only on s1
        put(m, f"a{i}", 64, 0.0, preferred_segments=("s1",))
    put(m, "filler", 512, 0.0, preferred_segments=("s2",))  # s2 has 512 free
    with pytest.raises(NoAvailableHandle, match="not enough room elsewhere .* 10 objects .640 bytes."):
        m.drain_start("d", "s1", 1.0)
    assert m.drains == {}
    put(m, "still", 64, 1.0, preferred_segments=("s1",))
    assert segments_of(m, "still") == ["s1"]  # s1 still takes puts
    alone = mounted(1)
    put(alone, "x", 64, 0.0)
    with pytest.raises(NoAvailableHandle, match="no other segment"):
        alone.drain_start("d", "s1", 0.0)
    assert alone.drains == {}


def test_a_second_drain_is_refused_while_the_first_drainer_lives_and_a_cancel_reopens_the_segment():
    m = mounted(2, lease_ttl=1.0, client_ttl=5.0)
    put(m, "k", 64, 0.0, preferred_segments=("s1",))
    put(m, "j", 64, 0.0, preferred_segments=("s1",))
    m.drain_start("d", "s1", 1.0)
    with pytest.raises(InvalidParams, match="being drained by d"):
        m.drain_start("e", "s1", 1.0)
    with pytest.raises(IllegalClient):
        m.drain_move_start("e", "s1", "k", 1.0)
    assert m.drain_start("d", "s1", 1.1).num_only_here == 2  # the same drainer resumes
    m.get_replica_list("k", 1.5)  # leased until 2.5
    move(m, "k", 1.6)
    m.drain_cancel("d", "s1", 1.7)
    with pytest.raises(InvalidParams, match="cancelled"):
        m.drain_move_start("d", "s1", "j", 1.7)
    # The range "k" left may be read until 2.5: s1 stays closed to new replicas until then.
    m.expire_drains(2.0)
    put(m, "early", 64, 2.0, preferred_segments=("s1",))
    assert segments_of(m, "early") == ["s2"]
    m.expire_drains(2.5)
    put(m, "late", 64, 2.5, preferred_segments=("s1",))
    assert segments_of(m, "late") == ["s1"] and segments_of(m, "j") == ["s1"]  # serving, unmoved
    # A drainer that goes silent is expired with its client, and its drain with it.
    m.drain_start("e", "s1", 3.0)
    m.ping("c1", 9.0), m.ping("c2", 9.0)
    m.expire_clients(9.0)
    m.expire_drains(9.0)
    assert m.drains == {}
    assert m.drain_start("d", "s1", 9.0).num_only_here == 2  # "j" and "late"


def test_a_put_in_flight_on_the_segment_is_waited_for_then_moved():
    m = mounted(2)
    m.put_start("c1", "w", 64, 0.0, ReplicateConfig(preferred_segments=("s1",)))
    assert m.drain_start("d", "s1", 0.5).num_in_flight == 1
    assert m.drain_pending("d", "s1", 0.5, 10).in_flight == ["w"]
    with pytest.raises(InvalidParams, match="still holds 1 objects"):
        m.drain_finish("d", "s1", 0.5)
    m.put_end("c1", "w", 0.6)
    assert m.drain_pending("d", "s1", 0.7, 10).to_move == ["w"]
    move(m, "w", 0.7)
    assert m.drain_finish("d", "s1", 0.8).num_dropped == 0 and segments_of(m, "w") == ["s2"]
