"""Two-phase puts: validation, ownership, placement, preemption, upsert and the batch forms."""

import pytest

from master_helpers import KIB, base, master, mounted, put, segment, where
from store.errors import (IllegalClient, InvalidParams, NoAvailableHandle, ObjectAlreadyExists,
                          ObjectHasLease, ObjectNotFound, ReplicaIsNotReady)
from store.objects import ReplicateConfig


def test_a_put_is_invisible_until_put_end_then_readable():
    m = mounted(1)
    replicas = m.put_start("c1", "k", 100, now=1.0)
    assert where(replicas) == [("s1", base(1))]
    assert replicas[0].segment_name == "seg1" and replicas[0].endpoint == "ep1" and replicas[0].size == 100
    assert not m.exists("k")
    with pytest.raises(ReplicaIsNotReady) as info:
        m.get_replica_list("k", now=1.5)
    assert info.value.code == -703
    m.put_end("c1", "k", now=2.0, checksum=0xABC)
    assert m.exists("k")
    got = m.get_replica_list("k", now=3.0)
    assert (got.key, got.size, got.checksum, got.lease_ttl) == ("k", 100, 0xABC, 10.0)
    assert where(got.replicas) == [("s1", base(1))]
    m.put_end("c1", "k", now=4.0)  # a retried PutEnd after a lost reply is harmless
    assert m.get_replica_list("k", now=5.0).checksum == 0xABC
    assert (m.stats.num_put_starts, m.stats.num_put_ends) == (1, 1)


@pytest.mark.parametrize("key, size, config", [
    ("k", 0, {}), ("k", -1, {}), ("k", True, {}), ("k", 1.5, {}), ("k", "64", {}),
    ("", 64, {}), (None, 64, {}), ("x" * 4097, 64, {}),
    ("k", 64, {"replica_num": 0}), ("k", 64, {"replica_num": -2}),
    ("k", 64, {"soft_pin": True, "soft_pin_ttl": 0}),
])
def test_invalid_puts_are_refused_with_invalid_params_and_change_nothing(key, size, config):
    m = mounted(1)
    with pytest.raises(InvalidParams) as info:
        m.put_start("c1", key, size, now=1.0, config=ReplicateConfig(**config))
    assert info.value.code == -600
    assert m.objects == {} and m.used_bytes == 0 and m.stats.num_put_starts == 0


def test_an_empty_client_id_is_invalid():
    with pytest.raises(InvalidParams):
        mounted(1).put_start("", "k", 64, now=0.0)


def test_put_end_and_revoke_from_another_client_are_illegal():
    m = mounted(2)
    m.put_start("c1", "k", 64, now=0.0)
    with pytest.raises(IllegalClient) as info:
        m.put_end("c2", "k", now=1.0)
    assert info.value.code == -601
    with pytest.raises(IllegalClient):
        m.put_revoke("c2", "k", now=1.0)
    assert not m.exists("k")
    m.put_end("c1", "k", now=2.0)
    assert m.exists("k")


def test_put_end_or_revoke_of_an_unknown_key_is_not_found():
    m = mounted(1)
    with pytest.raises(ObjectNotFound) as info:
        m.put_end("c1", "nope", now=0.0)
    assert info.value.code == -704
    with pytest.raises(ObjectNotFound):
        m.put_revoke("c1", "nope", now=0.0)


def test_put_revoke_frees_the_ranges_and_a_complete_object_cannot_be_revoked():
    m = mounted(1)
    m.put_start("c1", "k", 100, now=0.0)
    assert m.used_bytes == 128
    m.put_revoke("c1", "k", now=1.0)
    assert m.used_bytes == 0 and "k" not in m.objects and m.stats.num_put_revokes == 1
    put(m, "done", 64, now=2.0)
    with pytest.raises(InvalidParams):
        m.put_revoke("c1", "done", now=3.0)


def test_a_complete_key_is_taken_forever_and_an_in_flight_one_until_the_discard_timeout():
    m = mounted(2, put_start_discard_timeout=30.0)
    put(m, "done", 64, now=0.0)
    with pytest.raises(ObjectAlreadyExists) as info:
        m.put_start("c2", "done", 64, now=1000.0)
    assert info.value.code == -705

    first = m.put_start("c1", "k", 64, now=10.0, config=ReplicateConfig(preferred_segments=("s2",)))
    with pytest.raises(ObjectAlreadyExists):
        m.put_start("c2", "k", 64, now=39.9)  # 29.9 s old: the writer may still be copying
    # 30 s old: presumed abandoned. c2 takes the key over; c1's range is freed and reused.
    second = m.put_start("c2", "k", 64, now=40.0, config=ReplicateConfig(preferred_segments=("s2",)))
    assert where(second) == where(first) == [("s2", base(2) + 64)]
    assert m.stats.num_preempted == 1 and m.used_bytes == 64 * 2
    with pytest.raises(IllegalClient):
        m.put_end("c1", "k", now=41.0)  # the preempted writer learns it lost the key
    m.put_end("c2", "k", now=41.0)
    assert m.exists("k")


def test_replicas_go_to_distinct_segments_and_are_best_effort():
    m = mounted(3)
    replicas = put(m, "k3", 64, now=0.0, replica_num=3)
    assert sorted(r.segment_id for r in replicas) == ["s1", "s2", "s3"]
    replicas = put(m, "k5", 64, now=0.0, replica_num=5)  # only three segments exist
    assert len({r.segment_id for r in replicas}) == 3
    assert m.stats.num_partial_allocations == 1


def test_preferred_segments_come_first_in_the_given_order():
    m = mounted(3)
    replicas = put(m, "k", 64, now=0.0, replica_num=2, preferred_segments=("s3", "s1", "s9"))
    assert where(replicas) == [("s3", base(3)), ("s1", base(1))]


def test_free_ratio_first_places_on_the_emptiest_segments():
    m = mounted(3, allocation_strategy="free_ratio_first")
    put(m, "fill1", 512, now=0.0, preferred_segments=("s1",))
    put(m, "fill2", 256, now=0.0, preferred_segments=("s2",))
    replicas = put(m, "k", 100, now=1.0, replica_num=2)
    assert where(replicas) == [("s3", base(3)), ("s2", base(2) + 256)]
    replicas = put(m, "k2", 64, now=1.0)
    assert where(replicas) == [("s3", base(3) + 128)]  # s3 is 7/8 free, s2 5/8, s1 1/2


def test_local_first_keeps_the_bytes_on_the_writers_host():
    m = mounted(3, allocation_strategy="local_first")
    assert where(put(m, "a", 64, now=0.0, client="c2")) == [("s2", base(2))]
    # A client without a segment names its host; segments on it count as local.
    assert where(put(m, "b", 64, now=0.0, client="reader", host="h3")) == [("s3", base(3))]
    replicas = put(m, "c", 64, now=0.0, client="c2", replica_num=2)
    assert replicas[0].segment_id == "s2" and replicas[1].segment_id in ("s1", "s3")


def test_random_placement_is_reproducible_from_the_seed_and_spreads_load():
    def placements(seed):
        m = master(seed=seed)
        for i in range(1, 9):
            m.mount_segment(f"c{i}", segment(i, 64 * KIB), now=0.0)
        return [put(m, f"k{j}", 64, now=0.0)[0].segment_id for j in range(40)]
    assert placements(7) == placements(7)
    assert len(set(placements(7))) >= 4


def test_an_object_larger_than_every_segment_fails_without_evicting_anything():
    m = mounted(2)
    put(m, "small", 64, now=0.0)
    with pytest.raises(NoAvailableHandle) as info:
        m.put_start("c1", "huge", 1 << 40, now=1.0)
    assert info.value.code == -200
    assert m.exists("small") and m.stats.num_evicted == 0 and m.stats.num_allocation_failures == 1


def test_no_segment_at_all_is_no_available_handle():
    with pytest.raises(NoAvailableHandle):
        master().put_start("c1", "k", 64, now=0.0)


def test_upsert_of_the_same_size_rewrites_in_place_and_hides_the_object_meanwhile():
    m = mounted(2)
    first = put(m, "k", 100, now=0.0, replica_num=2)
    again = m.upsert_start("c2", "k", 100, now=5.0)
    assert where(again) == where(first)
    assert not m.exists("k")
    with pytest.raises(ReplicaIsNotReady):
        m.get_replica_list("k", now=5.5)
    with pytest.raises(IllegalClient):
        m.put_end("c1", "k", now=6.0)  # the upsert's writer owns it now
    m.put_end("c2", "k", now=6.0, checksum=7)
    assert m.get_replica_list("k", now=7.0).checksum == 7 and m.used_bytes == 2 * 128


def test_upsert_of_another_size_reallocates_and_upsert_of_a_new_key_is_a_put():
    m = mounted(1)
    put(m, "k", 64, now=0.0)
    put(m, "other", 64, now=0.0)
    replicas = m.upsert_start("c1", "k", 200, now=1.0)
    assert where(replicas) == [("s1", base(1) + 128)]  # the freed 64 bytes at 0 are too small
    m.put_end("c1", "k", now=1.0)
    assert m.get_replica_list("k", now=2.0).size == 200 and m.used_bytes == 64 + 256
    assert where(m.upsert_start("c1", "new", 64, now=3.0)) == [("s1", base(1))]


def test_upsert_waits_for_readers_and_revoking_it_removes_the_object():
    m = mounted(1)
    put(m, "k", 64, now=0.0)
    m.get_replica_list("k", now=1.0)  # leased until 11
    with pytest.raises(ObjectHasLease) as info:
        m.upsert_start("c1", "k", 64, now=5.0)
    assert info.value.code == -706
    m.upsert_start("c1", "k", 64, now=11.0)
    m.put_revoke("c1", "k", now=12.0)  # the old bytes may be half overwritten: they are gone
    assert "k" not in m.objects and m.used_bytes == 0


def test_upsert_of_a_young_in_flight_put_is_refused():
    m = mounted(1)
    m.put_start("c1", "k", 64, now=0.0)
    with pytest.raises(ObjectAlreadyExists):
        m.upsert_start("c2", "k", 64, now=1.0)
    assert where(m.upsert_start("c2", "k", 64, now=30.0)) == [("s1", base(1))]
    assert m.stats.num_preempted == 1


def test_batch_forms_answer_per_item():
    m = mounted(1)
    put(m, "old", 64, now=0.0)
    started = m.batch_put_start("c1", ["a", "old", "", "b"], [64, 64, 64, 0], now=1.0)
    assert where(started[0]) == [("s1", base(1) + 64)]
    assert [type(r).__name__ for r in started[1:]] == ["ObjectAlreadyExists", "InvalidParams", "InvalidParams"]
    ended = m.batch_put_end("c1", ["a", "zzz"], now=2.0, checksums=[11, None])
    assert ended[0] is None and isinstance(ended[1], ObjectNotFound)
    assert m.batch_exists(["a", "old", "zzz"]) == [True, True, False]
    lists = m.batch_get_replica_list(["a", "zzz"], now=3.0)
    assert lists[0].checksum == 11 and isinstance(lists[1], ObjectNotFound)
    m.batch_upsert_start("c1", ["old", "c"], [64, 64], now=4.0)
    assert m.batch_put_revoke("c1", ["old", "c", "zzz"], now=5.0)[:2] == [None, None]
    with pytest.raises(InvalidParams):
        m.batch_put_start("c1", ["x", "y"], [64], now=6.0)
    with pytest.raises(InvalidParams):
        m.batch_put_end("c1", ["x", "y"], now=6.0, checksums=[1])
