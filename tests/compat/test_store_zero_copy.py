"""MooncakeDistributedStore's calls on registered memory named by raw address, ReplicateConfig
and MooncakeHostMemAllocator, against a running cluster."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake.store import MooncakeHostMemAllocator, ReplicateConfig, SoftPinAction

NOT_FOUND, INVALID, NOT_REGISTERED, OVERLAPPED = -704, -600, -3, -7


@pytest.fixture
def memory(store):
    """Two registered 64 KiB host arrays: a source with a pattern and a zeroed destination."""
    source = (np.arange(1 << 16) % 251).astype(np.uint8)
    target = np.zeros(1 << 16, dtype=np.uint8)
    for array in (source, target):
        assert store.register_buffer(array.ctypes.data, array.nbytes) == 0
    yield source, target
    for array in (source, target):
        store.unregister_buffer(array.ctypes.data)


def test_register_codes(store):
    array = np.zeros(4096, dtype=np.uint8)
    assert store.put_from("unregistered", array.ctypes.data, 4096) == NOT_REGISTERED
    assert store.register_buffer(array.ctypes.data, 4096) == 0
    assert store.register_buffer(array.ctypes.data + 10, 10) == OVERLAPPED
    assert store.register_buffer(0, 10) == INVALID
    assert store.unregister_buffer(array.ctypes.data) == 0
    assert store.unregister_buffer(array.ctypes.data) == NOT_REGISTERED


def test_put_from_and_get_into_with_bad_sizes(store, memory):
    source, target = memory
    src, dst = source.ctypes.data, target.ctypes.data
    assert store.put_from("zc", src, 4096) == 0
    assert store.get_into("zc", dst, 1 << 16) == 4096 and (target[:4096] == source[:4096]).all()
    assert store.get_into("zc", dst, 100) == INVALID  # smaller than the object
    assert store.get_into("missing", dst, 100) == NOT_FOUND
    assert store.put_from("zero", src, 0) == INVALID
    assert store.put_from("past-end", src, (1 << 16) + 1) == NOT_REGISTERED
    assert store.get_into("zc", dst + (1 << 16) - 10, 4096) == NOT_REGISTERED


def test_batches_align_results_with_keys(store, memory):
    source, target = memory
    src, dst = source.ctypes.data, target.ctypes.data
    assert store.batch_put_from(["b1", "b2", "b3"], [src, src + 100, src], [10, 20, 0]) == [0, 0, INVALID]
    assert store.batch_put_from(["b1"], [src + 5], [10]) == [0]  # exists: a success
    assert store.batch_get_into(["b1", "missing", "b2"], [dst, dst + 100, dst + 200], [10, 10, 20]) == [10, NOT_FOUND, 20]
    assert (target[:10] == source[:10]).all() and (target[200:220] == source[100:120]).all()
    assert store.batch_put_from(["b4"], [src], [10, 20]) == [INVALID]  # lists of different lengths


def test_multi_buffers_gather_and_scatter_in_order(store, memory):
    source, target = memory
    src, dst = source.ctypes.data, target.ctypes.data
    stray = np.ones(64, dtype=np.uint8)
    assert store.batch_put_from_multi_buffers(
        ["m1", "m2", "m3"], [[src, src + 1000], [src + 2000], [stray.ctypes.data]], [[10, 20], [5], [64]]) == [0, 0, NOT_REGISTERED]
    read = store.batch_get_into_multi_buffers(["m1", "m2", "missing"], [[dst + 500, dst], [dst + 900], [dst + 950]],
                                              [[20, 10], [5], [5]])
    assert read == [30, 5, NOT_FOUND]
    assert (target[500:510] == source[:10]).all() and (target[510:520] == source[1000:1010]).all()
    assert (target[:10] == source[1010:1020]).all() and (target[900:905] == source[2000:2005]).all()


def test_get_into_ranges_copies_pieces_of_objects(store, memory):
    source, target = memory
    src, dst = source.ctypes.data, target.ctypes.data
    assert store.batch_put_from(["r1", "r2"], [src, src + 300], [256, 256]) == [0, 0]
    results = store.get_into_ranges([dst], [["r1", "r2", "missing"]], [[[0, 16], [32], [48]]],
                                    [[[8, 100], [250], [0]]], [[[4, 4], [10], [4]]])
    assert results == [[[4, 4], [INVALID], [NOT_FOUND]]]
    assert (target[:4] == source[8:12]).all() and (target[16:20] == source[100:104]).all()


def test_replica_descriptors(store):
    assert store.put("described", b"x" * 100) == 0
    descriptors = store.batch_get_replica_desc(["described", "missing"])
    assert list(descriptors) == ["described"]
    replica = descriptors["described"][0]
    assert replica.is_memory_replica() and not replica.is_disk_replica()
    assert replica.get_memory_descriptor().buffer_descriptor.size == 100


def test_replicate_config_is_checked_when_a_put_uses_it(store):
    config = ReplicateConfig()
    config.soft_pin_ttl_ms = 60_000
    assert store.put("pinned", b"x", config) == INVALID  # a TTL needs SoftPinAction.ENABLE
    config.soft_pin_action = SoftPinAction.ENABLE
    config.preferred_segment = store.get_hostname()
    config.with_hard_pin = True
    assert store.put("pinned", b"x", config) == 0
    row = store._client.master.inspect("key", key="pinned")  # the master's view, as `mooncake inspect`
    assert row["hard_pinned"] and 59 < row["soft_pin_left"] <= 60
    assert row["replicas"][0]["segment_id"] == store._client.owner.segment.segment_id  # preferred
    config.replica_num = 0
    assert store.put("no-replica", b"x", config) == INVALID
    config.replica_num, config.preferred_segments = 1, []
    for bad in (-1, 1 << 64, 1.5, "60s"):  # the original's optional uint64 refuses these at once
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad
    assert config.soft_pin_ttl_ms == 60_000
    config.soft_pin_ttl_ms = None
    assert config.soft_pin_ttl_ms is None


def test_host_memory_allocator_gives_registrable_memory(store):
    allocator = MooncakeHostMemAllocator()
    address = allocator.alloc(1 << 20)
    assert address and address % 4096 == 0
    assert store.register_buffer(address, 1 << 20) == 0
    assert store.put("hostmem", b"abc") == 0 and store.get_into("hostmem", address, 1 << 20) == 3
    assert store.unregister_buffer(address) == 0
    assert allocator.free(address) == 0 and allocator.free(address) == -1
