"""The op log's pure half: what a leader hands to etcd, and the state a new leader rebuilds from it.

``etcd`` here is a dict that applies batches the way the writer's transactions do.
"""

from store.objects import ReplicateConfig, ReportedObject
from store.oplog import OpLogJournal, record_adopted, replay
from tests.store.master_helpers import KIB, master, segment, where


def leader(n: int = 2):
    m = master()
    m.journal = OpLogJournal()
    for i in range(1, n + 1):
        m.mount_segment(f"c{i}", segment(i, 4 * KIB), now=0.0)
    return m


def flush(m, etcd: dict) -> int:
    batches, upto = m.journal.take(m.segments)
    for batch in batches:
        for prefix in batch.delete_prefixes:
            for key in [k for k in etcd if k.startswith(prefix)]:
                del etcd[key]
        for key, value in batch.puts.items():
            if value is None:
                etcd.pop(key, None)
            else:
                etcd[key] = value
    return upto


def successor(etcd: dict, now: float = 10.0):
    m = master()
    m.journal = OpLogJournal()
    replay(m, dict(etcd), now)
    return m


def test_completed_objects_come_back_where_they_were_with_their_checksums():
    m, etcd = leader(), {}
    placed = m.put_start("c1", "a", 100, 1.0, ReplicateConfig(replica_num=2))
    m.put_end("c1", "a", 1.0, checksum=7)
    m.put_start("c1", "pending", 100, 1.0)  # never completed: not in the log
    assert flush(m, etcd) == m.journal.num_changes == 2
    new = successor(etcd)
    got = new.get_replica_list("a", 10.0)
    assert where(got.replicas) == where(placed) and got.checksum == 7
    assert not new.exists("pending")
    # Its owners are told to re-mount, and will hear of the object on their next ping.
    assert {c: s.registered for c, s in new.clients.items()} == {"c1": False, "c2": False}
    assert [c.key for c in new.journal.since("s1", 0)] == ["a"]


def test_a_replayed_object_keeps_its_range_so_new_puts_do_not_overwrite_it():
    m, etcd = leader(1), {}
    first = m.put_start("c1", "a", 1000, 1.0)
    m.put_end("c1", "a", 1.0)
    flush(m, etcd)
    new = successor(etcd)
    second = new.put_start("c1", "b", 1000, 10.0)
    assert second[0].address != first[0].address


def test_removed_evicted_and_revoked_objects_leave_the_log():
    m, etcd = leader(), {}
    for key in ("gone", "kept"):
        m.put_start("c1", key, 100, 1.0)
        m.put_end("c1", key, 1.0)
    flush(m, etcd)
    m.remove("gone", 2.0)
    flush(m, etcd)
    assert sorted(successor(etcd).objects) == ["kept"]


def test_a_change_made_and_undone_between_flushes_costs_one_delete():
    m, etcd = leader(), {}
    m.put_start("c1", "brief", 100, 1.0, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", "brief", 1.0)
    m.remove("brief", 1.0)
    batches, _ = m.journal.take(m.segments)
    assert [b.puts for b in batches[1:]] == [{"replicas/s1/brief": None}]  # [0]: the two mounts


def test_an_unmounted_segment_leaves_with_its_replicas_and_a_remount_starts_clean():
    m, etcd = leader(), {}
    m.put_start("c1", "a", 100, 1.0, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", "a", 1.0)
    flush(m, etcd)
    m.unmount_segment("c1", "s1", 2.0)
    m.mount_segment("c1", segment(1, 4 * KIB), 2.0)
    m.put_start("c1", "b", 100, 2.0, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", "b", 2.0)
    batches, _ = m.journal.take(m.segments)
    # The put after the prefix delete rides a later transaction: etcd refuses both in one.
    assert [sorted(b.delete_prefixes) for b in batches] == [["replicas/s1/"], []]
    for batch in batches:
        assert not any(batch.covers(k) for k in batch.puts)


def test_a_segment_whose_record_is_missing_drops_its_replicas_and_a_silent_owner_expires():
    m, etcd = leader(), {}
    m.put_start("c1", "a", 100, 1.0, ReplicateConfig(preferred_segments=("s2",)))
    m.put_end("c1", "a", 1.0)
    flush(m, etcd)
    new = successor({k: v for k, v in etcd.items() if k != "segments/s2"})
    assert not new.exists("a")
    new = successor(etcd, now=10.0)
    new.expire_clients(10.0 + new.policy.client_ttl)
    assert not new.objects and not new.segments


def test_objects_a_remount_reports_that_the_log_lacked_are_logged():
    m, etcd = leader(1), {}
    flush(m, etcd)
    m.remount("c1", [segment(1, 4 * KIB)], [ReportedObject("old", "s1", 1 << 20, 64, 5)], 2.0)
    record_adopted(m, ["old"])
    flush(m, etcd)
    assert successor(etcd).get_replica_list("old", 10.0).checksum == 5
