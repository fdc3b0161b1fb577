"""The KV events the master state machine records (store.events.recorder), exactly.

Segments are 1 KiB with 64-byte alignment; client ci owns segment si. Each test drains the
events the setup recorded first, then checks what one operation adds.
"""

from master_helpers import base, mounted, put
from store.events.messages import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from store.events.recorder import CLEARED, REMOVED, STORED, StoreEvent, batch_of
from store.objects import ReplicateConfig
from store.segment_journal import SegmentChange


def drained(m):
    return m.kv_events.take()


def test_a_put_is_stored_on_each_replica_at_its_end_not_its_start():
    m = mounted(3)
    m.put_start("c1", "k", 64, 0.0, ReplicateConfig(replica_num=2, preferred_segments=("s1", "s2")))
    assert drained(m) == []  # nobody may read a replica being written
    m.put_end("c1", "k", 0.1)
    assert drained(m) == [StoreEvent(STORED, "k", "s1"), StoreEvent(STORED, "k", "s2")]
    m.put_end("c1", "k", 0.2)  # a retried end changes nothing
    assert drained(m) == []


def test_a_put_end_records_named_tuples_field_for_field():
    """Events and journal changes are built from all their fields (store.objects.tuple_of): each
    must be what its constructor makes, so a field added later cannot go missing."""
    m = mounted(1)
    drained(m)
    m.put_start("c1", "k", 64, 0.0)
    m.put_end("c1", "k", 0.1, checksum=7)
    events = drained(m)
    assert events == [StoreEvent(STORED, "k", "s1")] and type(events[0]) is StoreEvent
    changes = m.journal.since("s1", 0)
    assert changes[-1] == SegmentChange(changes[-1].seq, "complete", "k", base(1), 64, 7, False)
    assert type(changes[-1]) is SegmentChange and len(changes[-1]) == len(SegmentChange._fields)


def test_the_journal_hands_an_owner_what_it_has_not_acknowledged_in_order():
    m = mounted(1)
    m.batch_put_start("c1", ["a", "b", "c"], [64, 64, 64], 0.0)
    m.batch_put_end("c1", ["a", "b", "c"], 0.1)
    seqs = [c.seq for c in m.journal.since("s1", 0)]
    assert [(c.kind, c.key) for c in m.journal.since("s1", 0)] == [("complete", k) for k in "abc"]
    assert seqs == list(range(seqs[0], seqs[0] + 3))  # without a gap
    assert [c.key for c in m.journal.since("s1", seqs[1])] == ["c"]
    assert [c.key for c in m.journal.since("s1", seqs[0])] == ["c"]  # an old ack trims nothing more
    m.remove("a", 0.2)
    assert [(c.kind, c.key) for c in m.journal.since("s1", seqs[1])] == [("complete", "c"), ("gone", "a")]
    assert m.journal.since("s1", seqs[2] + 5) == []  # an ack beyond the last: all of it
    m.put_start("c1", "d", 64, 0.3)
    m.put_end("c1", "d", 0.3)
    assert [(c.seq, c.key) for c in m.journal.since("s1", 0)] == [(seqs[2] + 2, "d")]


def test_batch_put_end_records_every_key_and_a_revoke_records_nothing():
    m = mounted(1)
    m.batch_put_start("c1", ["a", "b", "c"], [64, 64, 64], 0.0)
    m.batch_put_end("c1", ["a", "b"], 0.1)
    m.put_revoke("c1", "c", 0.1)
    assert drained(m) == [StoreEvent(STORED, "a", "s1"), StoreEvent(STORED, "b", "s1")]


def test_remove_and_batch_remove_record_each_replica():
    m = mounted(2)
    put(m, "a", 64, 0.0, replica_num=2)
    put(m, "b", 64, 0.0, preferred_segments=("s2",))
    drained(m)
    m.remove("a", 1.0)
    assert sorted(drained(m)) == [StoreEvent(REMOVED, "a", "s1"), StoreEvent(REMOVED, "a", "s2")]
    m.batch_remove(["b", "missing"], 1.0)
    assert drained(m) == [StoreEvent(REMOVED, "b", "s2")]


def test_eviction_records_removed_in_eviction_order():
    m = mounted(1, high_watermark=0.5, eviction_ratio=0.0)
    for i, key in enumerate(["old", "mid", "new"]):
        put(m, key, 256, float(i))
    drained(m)
    assert m.evict(10.0) == ["old"]  # 768 of 1024 used: down to the 512 watermark
    assert drained(m) == [StoreEvent(REMOVED, "old", "s1")]


def test_a_put_that_has_to_evict_records_the_victim_before_its_own_store():
    m = mounted(1)
    for i in range(4):
        put(m, f"k{i}", 256, float(i))
    drained(m)
    put(m, "k4", 256, 5.0)
    assert drained(m) == [StoreEvent(REMOVED, "k0", "s1"), StoreEvent(STORED, "k4", "s1")]


def test_a_copy_adds_a_store_per_new_replica_and_a_move_removes_the_source():
    m = mounted(3)
    put(m, "k", 64, 0.0, preferred_segments=("s1",))
    drained(m)
    m.copy_start("c9", "k", ["s2"], 1.0)
    assert drained(m) == []
    m.copy_end("c9", "k", 1.1)
    assert drained(m) == [StoreEvent(STORED, "k", "s2")]
    m.copy_start("c9", "k", ["s3"], 2.0)
    m.copy_end("c9", "k", 2.1, drop_segment="s1")
    assert drained(m) == [StoreEvent(STORED, "k", "s3"), StoreEvent(REMOVED, "k", "s1")]


def test_an_upsert_removes_the_old_object_and_stores_the_new_one():
    m = mounted(1)
    put(m, "k", 64, 0.0)
    drained(m)
    m.upsert_start("c1", "k", 64, 1.0)  # same size: overwritten in place
    assert drained(m) == [StoreEvent(REMOVED, "k", "s1")]
    m.put_revoke("c1", "k", 1.1)  # its half-written bytes were never readable: nothing more
    assert drained(m) == []
    put(m, "k", 64, 2.0)
    drained(m)
    m.upsert_start("c1", "k", 128, 3.0)  # another size: the old ranges are freed
    m.put_end("c1", "k", 3.1)
    assert drained(m) == [StoreEvent(REMOVED, "k", "s1"), StoreEvent(STORED, "k", "s1")]


def test_remove_all_that_empties_the_store_is_one_clear():
    m = mounted(2)
    put(m, "a", 64, 0.0)
    put(m, "b", 64, 0.0)
    drained(m)
    assert m.remove_all(1.0) == 2
    assert drained(m) == [StoreEvent(CLEARED)]


def test_remove_all_that_leaves_a_leased_object_lists_what_it_removed():
    m = mounted(1)
    put(m, "a", 64, 0.0)
    put(m, "b", 64, 0.0)
    m.get_replica_list("b", 0.5)  # leased: remove_all (unforced) leaves it
    drained(m)
    assert m.remove_all(1.0) == 1
    assert drained(m) == [StoreEvent(REMOVED, "a", "s1")]


def test_unmount_and_client_expiry_remove_the_segments_replicas():
    m = mounted(3, client_ttl=5.0)
    put(m, "a", 64, 0.0, replica_num=2, preferred_segments=("s1", "s2"))
    put(m, "b", 64, 0.0, preferred_segments=("s3",))
    m.put_start("c1", "half", 64, 0.0, ReplicateConfig(preferred_segments=("s1",)))
    drained(m)
    assert m.unmount_segment("c1", "s1", 1.0) == ["half"]
    assert drained(m) == [StoreEvent(REMOVED, "a", "s1")]  # "half" was never readable
    m.ping("c2", 4.0)
    m.expire_clients(8.0)  # c3 silent since 0.0: it goes with s3; c2 stays
    assert drained(m) == [StoreEvent(REMOVED, "b", "s3")]


def test_batch_of_groups_runs_per_segment_in_vllm_shape():
    events = [StoreEvent(STORED, "a", "s1"), StoreEvent(STORED, "b", "s1"), StoreEvent(STORED, "c", "s2"),
              StoreEvent(REMOVED, "a", "s1"), StoreEvent(CLEARED)]
    batch = batch_of(events, 12.5)
    assert batch.events == [BlockStored([b"a", b"b"], "s1"), BlockStored([b"c"], "s2"),
                            BlockRemoved([b"a"], "s1"), AllBlocksCleared()]
    assert KVEventBatch.decode(batch.encode()) == batch
