"""The op log through a real etcd: a disk copy and a pending hand-over written by the leader's
writer come back in a successor's replay (keys quoted, batched and fenced as in production)."""

from __future__ import annotations

import time

import pytest

from daemons.ha.oplog_writer import OpLogWriter
from store.master_service import StoreService
from store.objects import ReplicaTier, Segment
from store.oplog import OpLogJournal
from transfer.etcd.kv import EtcdKV
from transfer.etcd.leader import master_view_key
from transfer.settings import resolve

pytestmark = pytest.mark.timeout(60)
CLUSTER, LEADER = "oplog-test", "tcp://10.0.0.1:1"
OWNER, SEGMENT = "c1", Segment("host/seg-1", "host", 1 << 20, 4096, "ep", "h", "disk-ep")


def service(writer: OpLogWriter) -> StoreService:
    store = StoreService(resolve({"high_watermark": 0.01, "eviction_ratio": 0.0}, environ={}))
    store.state.journal = OpLogJournal()
    writer.attach(store)
    return store


def test_a_disk_copy_and_a_pending_hand_over_survive_a_takeover(etcd):
    kv = EtcdKV(etcd.endpoints)
    kv.put(master_view_key(CLUSTER), LEADER)  # the writer's fence: this master leads
    writer = OpLogWriter(kv, CLUSTER, LEADER, timeout=5.0)
    try:
        leader = service(writer)
        with leader.lock:
            s = leader.state
            s.mount_segment(OWNER, SEGMENT, 0.0)
            for key, checksum in (("on/disk", 7), ("handed", 8)):
                s.put_start(OWNER, key, 64, 1.0)
                s.put_end(OWNER, key, 1.0, checksum)
            s.evict(1.0)  # hands both to the owner to copy
            s.add_disk_replica(OWNER, "on/disk", SEGMENT.segment_id, SEGMENT.base, 7, 2.0)
        writer.wait_durable(writer.generation)

        successor = service(writer)
        assert writer.replay_into(successor, time.monotonic()) == 2
        with successor.lock:
            s = successor.state
            got = s.get_replica_list("on/disk", time.monotonic())
            assert [r.tier for r in got.replicas] == [ReplicaTier.DISK.value] and got.checksum == 7
            assert list(s.offload_pending) == ["handed"]
            assert [(c.kind, c.key) for c in s.journal.since(SEGMENT.segment_id, 0)] == [
                ("complete", "handed"), ("offload", "handed")]
    finally:
        writer.stop()


def test_a_run_time_quota_reaches_etcd_and_the_successor(etcd):
    kv = EtcdKV(etcd.endpoints)
    kv.put(master_view_key(CLUSTER), LEADER)
    writer = OpLogWriter(kv, CLUSTER, LEADER, timeout=5.0)
    try:
        leader = service(writer)
        with leader.lock:
            leader.state.set_tenant_quota("ay", 4096)
        writer.wait_durable(writer.generation)
        successor = service(writer)
        writer.replay_into(successor, time.monotonic())
        assert successor.state.tenants.quota("ay") == 4096
    finally:
        writer.stop()
