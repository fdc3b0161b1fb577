"""The rest of the documented surface: put/get sessions with ranged transfers, replica copy and
move tasks, put_from_with_metadata, get_replica_desc, init_all and the refused segment mounts.
The cluster's lease TTL is 2 s (conftest)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mooncake.store import ReplicateConfig, TaskStatus, TaskType
from tests.compat.conftest import make_store

INVALID, NOT_REGISTERED, NOT_FOUND, EXISTS, LEASE_EXPIRED, TASK_NOT_FOUND = -600, -3, -704, -705, -707, -1400
PAGE, LAYERS = 1024, 4


@pytest.fixture
def memory(store):
    """Registered source and destination buffers of one page per layer."""
    src = [np.full(PAGE, i + 1, dtype=np.uint8) for i in range(LAYERS)]
    dst = [np.zeros(PAGE, dtype=np.uint8) for _ in range(LAYERS)]
    for buf in src + dst:
        assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    yield src, dst
    for buf in src + dst:
        store.unregister_buffer(buf.ctypes.data)


@pytest.fixture
def other(master):
    """A second store: its segment is a copy or move target."""
    store = make_store(master)
    yield store
    store.close()


def layer_ranges(keys, buffers, layer):
    return [[buffers[layer].ctypes.data] for _ in keys], [[PAGE] for _ in keys], [[layer * PAGE] for _ in keys]


def test_sessions_put_and_get_objects_layer_by_layer(store, memory):
    src, dst = memory
    keys = ["sess-a", "sess-b"]
    assert store.batch_put_session_start(keys, [PAGE * LAYERS] * 2) == [0, 0]
    for layer in range(LAYERS):
        assert store.is_exist(keys[0]) == 0  # reserved, not readable before the end
        assert store.batch_put_from_multi_buffer_ranges(keys, *layer_ranges(keys, src, layer)) == [PAGE, PAGE]
    assert store.batch_put_session_end(keys) == [0, 0]
    assert store.get(keys[1]) == b"".join(bytes(b) for b in src)
    assert store.batch_get_session_start(keys) == [0, 0]
    for layer in reversed(range(LAYERS)):
        assert store.batch_get_into_multi_buffer_ranges(keys, *layer_ranges(keys, dst, layer)) == [PAGE, PAGE]
    assert store.batch_get_session_end(keys) == 0
    assert all((d == s).all() for d, s in zip(dst, src))


def test_session_calls_answer_the_originals_codes(store, memory):
    src, _ = memory
    stray = np.ones(PAGE, dtype=np.uint8)
    assert store.put("sess-taken", b"x") == 0
    assert store.batch_put_session_start(["sess-c", "sess-taken"], [PAGE, PAGE]) == [0, EXISTS]
    assert store.batch_put_session_start(["sess-c"], [PAGE]) == [INVALID]  # a session already
    assert store.batch_put_session_start(["sess-d"], []) == [INVALID]
    ptr = src[0].ctypes.data
    assert store.batch_put_from_multi_buffer_ranges(
        ["sess-c", "sess-c", "sess-none", "sess-c", "sess-c"],
        [[ptr], [ptr], [ptr], [ptr, ptr], [stray.ctypes.data]],
        [[PAGE], [PAGE], [PAGE], [PAGE], [PAGE]],
        [[0], [1], [0], [0], [0]]) == [PAGE, INVALID, INVALID, INVALID, NOT_REGISTERED]  # overflow, no session, lists
    assert store.batch_put_session_end(["sess-c", "sess-none"]) == [0, INVALID]
    assert store.batch_put_from_multi_buffer_ranges(["sess-c"], [[ptr]], [[PAGE]], [[0]]) == [INVALID]  # ended
    assert store.batch_get_session_start(["sess-c", "sess-missing"]) == [0, NOT_FOUND]
    assert store.batch_get_into_multi_buffer_ranges(["sess-c", "sess-missing"], [[ptr], [ptr]], [[8], [8]],
                                                    [[PAGE - 4], [0]]) == [INVALID, INVALID]
    assert store.batch_get_session_end(["sess-c"]) == 0
    assert store.batch_get_into_multi_buffer_ranges(["sess-c"], [[ptr]], [[8]], [[0]]) == [INVALID]


def test_a_revoked_session_leaves_nothing_behind(store, memory):
    src, _ = memory
    assert store.batch_put_session_start(["sess-revoked"], [PAGE * LAYERS]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["sess-revoked"], *layer_ranges(["k"], src, 0)) == [PAGE]
    used = store._client.master.inspect("counters")["used_bytes"]
    assert store.batch_put_session_revoke(["sess-revoked", "sess-none"]) == [0, INVALID]
    assert store.is_exist("sess-revoked") == 0 and store.get("sess-revoked") == b""
    assert store._client.master.inspect("counters")["used_bytes"] < used  # its space is free again
    assert store.put("sess-revoked", b"again") == 0 and store.get("sess-revoked") == b"again"


def test_close_revokes_the_open_put_sessions(master):
    store = make_store(master)
    assert store.batch_put_session_start(["sess-open"], [PAGE]) == [0]
    assert store.close() == 0
    fresh = make_store(master)
    try:
        assert fresh.put("sess-open", b"free") == 0  # no reservation left in the way
    finally:
        fresh.close()


def test_a_get_session_ends_with_its_lease(store, memory):
    _, dst = memory
    assert store.put("sess-lease", b"y" * PAGE) == 0
    assert store.batch_get_session_start(["sess-lease"]) == [0]
    time.sleep(2.1)  # the cluster's lease TTL: the range may hold another object by now
    args = [[dst[0].ctypes.data]], [[PAGE]], [[0]]
    assert store.batch_get_into_multi_buffer_ranges(["sess-lease"], *args) == [LEASE_EXPIRED]
    assert store.batch_get_into_multi_buffer_ranges(["sess-lease"], *args) == [INVALID]  # dropped


def finished(store, task_id):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        response, code = store.query_task(task_id)
        assert code == 0
        if response.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return response
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} still {response.status.name}")


def replica_segments(store, key):
    return sorted(r["segment_id"] for r in store._client.master.inspect("key", key=key)["replicas"])


def put_here(store, key, value):
    config = ReplicateConfig()
    config.preferred_segment = store.get_hostname()
    assert store.put(key, value, config) == 0


def test_a_copy_task_adds_a_replica_on_the_target(store, other):
    put_here(store, "task-copy", b"copied bytes")
    task_id, code = store.create_copy_task("task-copy", [other.get_hostname()])
    assert code == 0 and task_id != (0, 0)
    response = finished(store, task_id)
    assert response.status == TaskStatus.SUCCESS and response.type == TaskType.REPLICA_COPY
    assert response.id == task_id and response.created_at_ms_epoch <= response.last_updated_at_ms_epoch
    mine, theirs = store._client.owner.segment.segment_id, other._client.owner.segment.segment_id
    assert replica_segments(store, "task-copy") == sorted([mine, theirs])
    assert other.get("task-copy") == b"copied bytes"
    endpoints = [r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                 for r in store.get_replica_desc("task-copy")]
    assert sorted(endpoints) == sorted([store.get_hostname(), other.get_hostname()])  # as the official test reads


def test_a_move_task_leaves_the_object_only_on_the_target(store, other):
    put_here(store, "task-move", b"moved bytes")
    task_id, code = store.create_move_task("task-move", store.get_hostname(), other.get_hostname())
    assert code == 0
    response = finished(store, task_id)
    assert response.status == TaskStatus.SUCCESS and response.type == TaskType.REPLICA_MOVE
    assert replica_segments(store, "task-move") == [other._client.owner.segment.segment_id]
    assert store.get("task-move") == b"moved bytes"


def test_tasks_are_refused_with_the_originals_codes(store, other):
    put_here(store, "task-bad", b"x")
    me, them = store.get_hostname(), other.get_hostname()
    assert store.create_copy_task("task-missing", [them]) == ((0, 0), NOT_FOUND)
    assert store.create_copy_task("task-bad", []) == ((0, 0), INVALID)
    assert store.create_copy_task("task-bad", ["nowhere:1"]) == ((0, 0), INVALID)
    assert store.create_move_task("task-missing", me, them) == ((0, 0), NOT_FOUND)
    assert store.create_move_task("task-bad", me, me) == ((0, 0), INVALID)
    assert store.create_move_task("task-bad", them, me) == ((0, 0), INVALID)  # no replica there
    assert store.create_move_task("task-bad", me, "nowhere:1") == ((0, 0), INVALID)
    assert store.query_task((1, 2)) == (None, TASK_NOT_FOUND)


def test_put_from_with_metadata_stores_the_metadata_first(store):
    data = np.frombuffer(b"payload-bytes", dtype=np.uint8).copy()
    header = np.frombuffer(b"HDR:", dtype=np.uint8).copy()
    for buf in (data, header):
        assert store.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    assert store.put_from_with_metadata("with-meta", data.ctypes.data, header.ctypes.data, data.nbytes,
                                        header.nbytes) == 0
    assert store.get("with-meta") == b"HDR:payload-bytes"
    assert store.put_from_with_metadata("no-meta", data.ctypes.data, header.ctypes.data, 7, 0) == 0
    assert store.get("no-meta") == b"payload"
    assert store.put_from_with_metadata("empty", data.ctypes.data, header.ctypes.data, 0, 4) == 0
    assert store.is_exist("empty") == 0  # nothing stored, as the original
    stray = np.ones(8, dtype=np.uint8)
    assert store.put_from_with_metadata("stray", stray.ctypes.data, header.ctypes.data, 8, 4) == NOT_REGISTERED


def test_get_replica_desc_init_all_and_the_refused_mounts(store):
    assert store.put("desc-one", b"z" * 10) == 0
    [replica] = store.get_replica_desc("desc-one")
    assert replica.is_memory_replica() and replica.get_memory_descriptor().buffer_descriptor.size == 10
    assert store.get_replica_desc("desc-missing") == []
    assert store.init_all("tcp", "") == INVALID  # set up already
    assert store.mount_segment("/dev/shm/some-region", 1 << 20) == {"ret": -1, "segment_ids": []}
    assert store.allocate_and_mount_segment(1 << 20) == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    assert store.unmount_segment(["x"]) == -1 and store.unmount_and_free_segment(["x"], 30) == -1
