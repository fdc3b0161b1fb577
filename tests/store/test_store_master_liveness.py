"""Segments and clients: mount rules, liveness expiry, and a master restart that loses nothing."""

import pytest

from master_helpers import base, master, mounted, put, segment, where
from store.errors import (IllegalClient, InvalidParams, ObjectNotFound, SegmentAlreadyExists,
                          SegmentNotFound)
from store.objects import ClientStatus, ReplicateConfig, ReportedObject, Segment


def test_mount_rules():
    m = master()
    m.mount_segment("c1", segment(1), now=0.0)
    m.mount_segment("c1", segment(1), now=1.0)  # a retried mount
    assert list(m.segments) == ["s1"] and m.capacity == 1024
    with pytest.raises(SegmentAlreadyExists) as info:
        m.mount_segment("c2", segment(1), now=1.0)
    assert info.value.code == -211
    with pytest.raises(SegmentAlreadyExists):
        m.mount_segment("c1", segment(1, size=2048), now=1.0)
    for bad in (Segment("", "n", 0, 1024), Segment("s9", "", 0, 1024), Segment("s9", "n", -1, 1024),
                Segment("s9", "n", 0, 10), Segment("s9", "n", 0, 1024.0)):
        with pytest.raises(InvalidParams):
            m.mount_segment("c1", bad, now=1.0)
    assert list(m.segments) == ["s1"]


def test_unmount_drops_the_replicas_on_the_segment_and_only_its_owner_may_do_it():
    m = mounted(2)
    put(m, "both", 64, now=0.0, replica_num=2)
    put(m, "only1", 64, now=0.0, preferred_segments=("s1",))
    with pytest.raises(IllegalClient):
        m.unmount_segment("c2", "s1", now=1.0)
    with pytest.raises(SegmentNotFound) as info:
        m.unmount_segment("c1", "s9", now=1.0)
    assert info.value.code == -210
    assert m.unmount_segment("c1", "s1", now=1.0) == ["only1"]
    assert where(m.get_replica_list("both", now=2.0).replicas) == [("s2", base(2))]
    assert m.stats.num_objects_lost == 1 and m.clients["c1"].segment_ids == []


def test_a_silent_client_is_dropped_with_its_segments_and_its_puts_in_flight():
    m = mounted(2, client_ttl=10.0)
    put(m, "on1", 64, now=0.0, client="c2", preferred_segments=("s1",))
    put(m, "on2", 64, now=0.0, client="c2", preferred_segments=("s2",))
    m.put_start("c2", "c2-writing-on-1", 64, now=0.0, config=_prefer("s1"))
    m.put_start("c1", "c1-writing-on-2", 64, now=0.0, config=_prefer("s2"))
    assert m.ping("c2", now=5.0) is ClientStatus.OK
    assert m.expire_clients(now=9.9) == []
    assert m.expire_clients(now=10.0) == ["c1"]  # silent since 0
    # c1's segment went, with what lay only there, and c1's own unfinished put was revoked.
    assert sorted(m.objects) == ["on2"]
    assert m.segments["s2"].allocator.num_used_bytes == 64
    with pytest.raises(ObjectNotFound):
        m.put_end("c2", "c2-writing-on-1", now=11.0)
    assert m.stats.num_expired_clients == 1 and m.stats.num_put_revokes == 1
    assert m.ping("c1", now=12.0) is ClientStatus.NEED_REMOUNT
    assert m.expire_clients(now=14.9) == []  # c2 pinged at 5 and put_end at 11


def test_a_client_met_only_through_a_put_must_remount_and_expires_like_any_other():
    m = mounted(1)
    m.put_start("pure", "k", 64, now=0.0)
    assert m.ping("pure", now=1.0) is ClientStatus.NEED_REMOUNT
    assert m.remount("pure", [], [], now=2.0) == {"accepted": [], "rejected": [], "disk_rejected": []}
    assert m.ping("pure", now=3.0) is ClientStatus.OK
    assert m.expire_clients(now=13.0) == ["c1", "pure"]
    assert m.objects == {} and m.segments == {}


def test_a_restarted_master_takes_back_every_object_on_live_segments():
    before = mounted(2)
    put(before, "x", 100, now=0.0, replica_num=2)
    before.put_end("c1", "x", now=0.0)
    put(before, "y", 64, now=0.0, preferred_segments=("s1",), hard_pin=True)
    reports = {cid: [ReportedObject(o.key, r.segment_id, r.address, o.size, o.checksum, o.hard_pinned)
                     for o in before.objects.values() for r in o.replicas
                     if before.segments[r.segment_id].client_id == cid]
               for cid in ("c1", "c2")}

    after = master()  # the restart: knows nothing
    assert after.ping("c1", now=100.0) is ClientStatus.NEED_REMOUNT
    answer = after.remount("c1", [segment(1)], reports["c1"], now=100.0)
    assert sorted(answer["accepted"]) == ["x", "y"] and answer["rejected"] == []
    assert after.remount("c2", [segment(2)], reports["c2"], now=100.0)["accepted"] == ["x"]
    assert after.ping("c1", now=101.0) is ClientStatus.OK
    for key in ("x", "y"):
        assert sorted(where(after.get_replica_list(key, now=101.0).replicas)) == \
               sorted(where(before.get_replica_list(key, now=1.0).replicas))
    assert after.objects["y"].hard_pinned and after.stats.num_adopted == 3
    # The re-learned ranges are in use: a new put does not land on them.
    assert after.used_bytes == before.used_bytes
    assert where(put(after, "z", 64, now=102.0, preferred_segments=("s1",))) == [("s1", base(1) + 192)]


def test_remount_rejects_reports_it_cannot_trust_or_place():
    m = mounted(2)
    put(m, "live", 64, now=0.0, preferred_segments=("s2",))
    m.objects["live"].checksum = 5
    reports = [
        ReportedObject("fine", "s1", base(1), 64),
        ReportedObject("clash", "s1", base(1), 64),          # overlaps "fine"
        ReportedObject("theirs", "s2", base(2) + 512, 64),  # not c1's segment
        ReportedObject("live", "s1", base(1) + 128, 64, checksum=6),  # another version of "live"
        ReportedObject("live", "s1", base(1) + 256, 128, checksum=5),  # another size
        ReportedObject("", "s1", base(1) + 384, 64),
        ReportedObject("odd", "s1", base(1) + 3, 64),       # unaligned
        ReportedObject("junk", "s1", None, 64),              # malformed
        ReportedObject("live", "s1", base(1) + 448, 64, checksum=5),  # the same object: a replica
    ]
    answer = m.remount("c1", [segment(1)], reports, now=1.0)
    assert answer == {"accepted": ["fine", "live"], "rejected": ["clash", "theirs", "live", "live", "", "odd", "junk"],
                      "disk_rejected": []}
    assert sorted(r.segment_id for r in m.objects["live"].replicas) == ["s1", "s2"]


def test_remount_unmounts_what_the_client_no_longer_reports_and_changes_nothing_when_refused():
    m = mounted(2)
    m.mount_segment("c1", segment(3), now=0.0)
    put(m, "on3", 64, now=0.0, preferred_segments=("s3",))
    with pytest.raises(SegmentAlreadyExists):
        m.remount("c1", [segment(1), segment(2)], [], now=1.0)  # s2 is c2's
    assert "on3" in m.objects and sorted(m.segments) == ["s1", "s2", "s3"]
    m.remount("c1", [segment(1)], [], now=2.0)
    assert "on3" not in m.objects and sorted(m.segments) == ["s1", "s2"]
    assert m.clients["c1"].segment_ids == ["s1"]


def test_remount_replaces_a_segment_whose_geometry_changed():
    m = mounted(1)
    put(m, "k", 64, now=0.0)
    m.remount("c1", [segment(1, size=4096)], [], now=1.0)
    assert m.capacity == 4096 and m.objects == {}


def _prefer(segment_id):
    return ReplicateConfig(preferred_segments=(segment_id,))
