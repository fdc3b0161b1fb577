"""MooncakeDistributedStore's set-up and bytes calls against a running cluster, with the
original's return codes: 0 or a size on success, -704 not found, -706 leased, -600 bad
arguments or a store that is not set up."""

from __future__ import annotations

import time

from mooncake.store import MooncakeDistributedStore

NOT_FOUND, HAS_LEASE, INVALID = -704, -706, -600


def test_setup_takes_seven_arguments_or_a_dict_and_refuses_bad_sizes(master):
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "global_segment_size": "50%",
                        "master_server_address": master}) != 0
    assert store.setup("127.0.0.1", "no-scheme", 0, 0, "tcp", "", master) == INVALID
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "carrier-pigeon", "", master) == INVALID
    assert store.setup({"local_hostname": "127.0.0.1", "metadata_server": "http://127.0.0.1:8080/metadata",
                        "global_segment_size": "1 GiB", "local_buffer_size": "16MB",
                        "master_server_address": master}) == 0
    host, port = store.get_hostname().split(":")
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert store.health_check() == 0
    assert store.close() == 0 and store.close() == 0
    for metadata in ("P2PHANDSHAKE", "etcd://127.0.0.1:2379", "127.0.0.1:2379"):
        other = MooncakeDistributedStore()
        assert other.setup("127.0.0.1:13999", metadata, 1 << 20, 1 << 20, "tcp", "", master) == 0
        assert other.get_hostname() == "127.0.0.1:13999"
        assert other.put(f"via-{metadata}", b"x") == 0 and other.get(f"via-{metadata}") == b"x"
        other.close()


def test_sglang_warmup_and_missing_keys(store):
    assert store.put("warm", b"up") == 0
    assert store.is_exist("warm") == 1 and store.get("warm") == b"up"
    assert store.get("missing") == b"" and store.get_size("missing") == NOT_FOUND
    assert store.is_exist("missing") == 0 and store.batch_is_exist(["warm", "missing"]) == [1, 0]
    assert store.get_buffer("missing") is None
    assert store.remove("missing") == NOT_FOUND


def test_an_existing_key_is_a_success_that_keeps_the_first_bytes_until_upsert(store):
    assert store.put("k", b"first") == 0
    assert store.put("k", b"second") == 0
    assert store.get("k") == b"first"
    assert store.upsert("k", b"replaced") == HAS_LEASE  # our get's lease still runs
    assert store.put("u", b"first") == 0 and store.upsert("u", b"replaced") == 0
    assert store.get("u") == b"replaced" and store.get_size("u") == 8


def test_batches_parts_and_buffers(store):
    assert store.put_batch(["a", "b"], [b"1", bytearray(b"22")]) == 0
    assert store.get_batch(["a", "missing", "b"]) == [b"1", b"", b"22"]
    assert store.put_parts("hdr+payload", b"H" * 28, memoryview(b"payload")) == 0
    handle = store.get_buffer("hdr+payload")
    assert bytes(memoryview(handle)) == b"H" * 28 + b"payload" and handle.size() == 35 and handle.ptr() > 0
    buffers = store.batch_get_buffer(["a", "missing"])
    assert bytes(buffers[0]) == b"1" and buffers[1] is None


def test_a_read_lease_refuses_remove_until_it_ends_or_force(store):
    assert store.put_batch(["l1", "l2", "l3"], [b"x", b"y", b"z"]) == 0
    assert store.get("l1") == b"x" and store.get_batch(["l2"]) == [b"y"]
    assert store.remove("l1") == HAS_LEASE
    assert store.batch_remove(["l2", "l3", "missing"]) == [HAS_LEASE, 0, NOT_FOUND]
    assert store.remove("l1", force=True) == 0
    time.sleep(2.2)  # the cluster's --lease-ttl
    assert store.remove("l2") == 0


def test_remove_all_counts_what_it_removed(store):
    assert store.put_batch(["r1", "r2"], [b"1", b"2"]) == 0
    store.get("r1")
    assert store.remove_all() >= 1  # r2 and what other tests of this module left unleased
    assert store.remove_all(force=True) >= 1
    assert store.batch_is_exist(["r1", "r2"]) == [0, 0]


def test_a_closed_store_answers_codes_not_exceptions(store):
    assert store.put("before", b"x") == 0
    assert store.close() == 0
    assert store.put("after", b"x") == INVALID and store.get("before") == b""
    assert store.is_exist("before") == INVALID and store.batch_is_exist(["before"]) == [INVALID]
    assert store.get_buffer("before") is None and store.health_check() == INVALID
    assert store.batch_put_from(["k"], [1], [1]) == [INVALID]


def test_setup_dummy_uses_the_pool_the_cluster_contributes(master, store):
    assert store.put("shared", b"pool") == 0
    dummy = MooncakeDistributedStore()
    assert dummy.setup_dummy(1 << 20, 1 << 20, master) == 0
    assert dummy.get("shared") == b"pool"
    assert dummy.put("from-dummy", b"d") == 0 and store.get("from-dummy") == b"d"
    dummy.close()
