"""The op log's pure half: what a leader hands to etcd, and the state a new leader rebuilds from it.

``etcd`` here is a dict that applies batches the way the writer's transactions do.
"""

from store.objects import ReplicateConfig, ReplicaTier, ReportedObject, Segment
from store.oplog import OpLogJournal, record_adopted, replay
from tests.store.master_helpers import KIB, base, master, segment, where


def leader(n: int = 2):
    m = master()
    m.journal = OpLogJournal()
    for i in range(1, n + 1):
        m.mount_segment(f"c{i}", segment(i, 4 * KIB), now=0.0)
    return m


def with_disk():
    """c1 owns s1 (1 KiB, an SSD tier); a second 64-byte object makes eviction hand one over."""
    m = master(high_watermark=0.05, eviction_ratio=0.0, client_ttl=5.0)
    m.journal = OpLogJournal()
    m.mount_segment("c1", Segment("s1", "seg1", base(1), KIB, "ep1", "h1", "disk1"), now=0.0)
    return m


def flush(m, etcd: dict) -> int:
    batches, upto = m.journal.take(m.segments, m.offload_pending)
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
    m = leader()
    m.put_start("c1", "brief", 100, 1.0, ReplicateConfig(preferred_segments=("s1",)))
    m.put_end("c1", "brief", 1.0)
    m.remove("brief", 1.0)
    batches, _ = m.journal.take(m.segments, m.offload_pending)
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
    batches, _ = m.journal.take(m.segments, m.offload_pending)
    # The put after the prefix delete rides a later transaction: etcd refuses both in one.
    assert [sorted(b.delete_prefixes) for b in batches] == [["disk/s1/", "replicas/s1/"], []]
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


def test_a_victim_handed_over_is_handed_to_its_owner_again_by_the_new_leader():
    m, etcd = with_disk(), {}
    m.put_start("c1", "a", 64, 1.0)
    m.put_end("c1", "a", 1.0, checksum=7)
    assert m.evict(1.0) == [] and list(m.offload_pending) == ["a"]
    flush(m, etcd)
    new = successor(etcd, now=10.0)
    # The owner may not have heard of it from the dead leader: it hears of it again, and the
    # deadline runs on the new leader's clock.
    assert new.offload_pending == {"a": 10.0 + new.policy.client_ttl}
    assert [(c.kind, c.key) for c in new.journal.since("s1", 0)] == [("complete", "a"), ("offload", "a")]
    # A read takes the victim back: the hand-over leaves the log.
    m.get_replica_list("a", 2.0)
    flush(m, etcd)
    assert "offloads/a" not in etcd and not successor(etcd).offload_pending


def test_an_object_held_only_on_disk_is_readable_from_the_new_leader_until_removed():
    m, etcd = with_disk(), {}
    m.put_start("c1", "a", 64, 1.0)
    m.put_end("c1", "a", 1.0, checksum=7)
    m.evict(1.0)
    m.add_disk_replica("c1", "a", "s1", base(1), 7, 2.0)  # the copy frees the memory
    flush(m, etcd)
    assert sorted(etcd) == ["disk/s1/a", "segments/s1"]
    new = successor(etcd)
    got = new.get_replica_list("a", 10.0)
    assert [r.tier for r in got.replicas] == [ReplicaTier.DISK.value] and got.checksum == 7
    assert new.used_bytes == 0 and "a" not in new.lru and not new.offload_pending
    m.remove("a", 3.0)
    flush(m, etcd)
    assert not successor(etcd).objects


def test_re_reported_files_are_logged_once_and_leave_with_their_segment():
    m, etcd = with_disk(), {}
    files = [ReportedObject("d", "s1", 0, 64, 9)]
    spec = m.segments["s1"].spec
    m.remount("c1", [spec], [], 1.0, files)
    flush(m, etcd)
    new = successor(etcd)
    new.journal.take(new.segments, new.offload_pending)  # what it read is in etcd already
    assert new.exists("d")
    # The owner re-mounts with the new leader and reports the file it already replayed.
    assert new.remount("c1", [spec], [], 10.0, files)["disk_rejected"] == []
    assert new.journal.take(new.segments, new.offload_pending)[0] == []
    m.unmount_segment("c1", "s1", 2.0)
    flush(m, etcd)
    assert etcd == {}


def test_a_quota_set_at_run_time_survives_a_failover_and_the_settings_quotas_stay_each_masters_own():
    m, etcd = leader(), {}
    m.set_tenant_quota("ay", 3 * KIB)
    m.set_tenant_quota("odd/name=1", 0)  # quoted in its key, and 0 (unlimited) is a quota too
    flush(m, etcd)
    new = successor(etcd)
    assert new.tenants.quotas == {"ay": 3 * KIB, "odd/name=1": 0}
    assert new.tenants.room("ay") == 3 * KIB
    m.set_tenant_quota("ay", KIB)  # the latest value wins: one key per tenant
    flush(m, etcd)
    assert successor(etcd).tenants.quota("ay") == KIB
