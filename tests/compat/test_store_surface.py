"""The rest of the official surface: the upsert family, batch_replica_clear, remove_by_regex,
mooncake.async_store, mooncake.mooncake_config, a zero local buffer, and store lifetimes."""

from __future__ import annotations

import asyncio
import gc
import json

import numpy as np
import pytest

from mooncake.async_store import MooncakeDistributedStoreAsync
from mooncake.mooncake_config import MooncakeConfig, _parse_segment_size
from mooncake.store import ReplicateConfig
from tests.compat.conftest import make_store

INVALID, HAS_LEASE = -600, -706


def test_upsert_family_replaces_values(store):
    assert store.put("u-parts", b"1234567890123") == 0
    assert store.upsert_parts("u-parts", b"Hello, ", b"World!") == 0 and store.get("u-parts") == b"Hello, World!"
    assert store.put("u-batch", b"old") == 0
    assert store.upsert_batch(["u-batch", "u-new"], [b"new value", b"fresh"]) == 0
    assert store.get_batch(["u-batch", "u-new"]) == [b"new value", b"fresh"]
    data = np.frombuffer(b"zero-copy-upsert", dtype=np.uint8).copy()
    assert store.register_buffer(data.ctypes.data, data.nbytes) == 0
    assert store.upsert_from("u-batch", data.ctypes.data, data.nbytes) == 0  # under the get's lease
    assert store.get("u-batch") == b"zero-copy-upsert"
    assert store.batch_upsert_from(["u-new", "u-from"], [data.ctypes.data] * 2, [4, 8]) == [0, 0]
    assert store.get_batch(["u-new", "u-from"]) == [b"zero", b"zero-cop"]
    assert store.batch_upsert_from(["u-x"], [data.ctypes.data], []) == [INVALID]
    assert store.unregister_buffer(data.ctypes.data) == 0


def test_remove_by_regex_removes_matching_keys(store):
    assert store.put_batch(["rx-a-1", "rx-a-2", "rx-b-1"], [b"1", b"2", b"3"]) == 0
    assert store.remove_by_regex("^rx-a-") == 2
    assert store.batch_is_exist(["rx-a-1", "rx-a-2", "rx-b-1"]) == [0, 0, 1]


def test_batch_replica_clear_keeps_leased_keys_and_rewrites_partial_clears(master, store):
    other = make_store(master)
    try:
        config = ReplicateConfig()
        config.replica_num = 2
        assert store.put("rc-two", b"two replicas", config) == 0
        assert store.put("rc-one", b"one") == 0
        assert store.batch_replica_clear(["rc-two", "rc-one", "rc-missing"]) == []  # fresh: leased
        row = store._client.master.inspect("key", key="rc-two")
        segments = {r["segment_id"] for r in row["replicas"]}
        assert len(segments) == 2  # two stores of one process hold the two replicas
        assert store.batch_replica_clear(["rc-two"], segment_name="nowhere:1") == []
        gone = next(s["segment_id"] for s in store._client.master.inspect("segments") if s["segment_id"] in segments)
        ttl = store._client.master.inspect("counters")["lease_ttl"]
        _wait(ttl)
        assert store.batch_replica_clear(["rc-two"], segment_name=gone) == ["rc-two"]
        left = {r["segment_id"] for r in store._client.master.inspect("key", key="rc-two")["replicas"]}
        assert left == segments - {gone} and other.get("rc-two") == b"two replicas"
        _wait(ttl)
        assert store.batch_replica_clear(["rc-two", "rc-one"]) == ["rc-two", "rc-one"]
        assert store.batch_is_exist(["rc-two", "rc-one"]) == [0, 0]
    finally:
        other.close()


def _wait(seconds: float) -> None:
    import time
    time.sleep(seconds + 0.1)


def test_replica_num_two_across_two_stores_of_one_process(master, store):
    other = make_store(master)
    try:
        config = ReplicateConfig()
        config.replica_num = 2
        assert store.put("two-stores", b"x" * 4096, config) == 0
        assert other.get("two-stores") == b"x" * 4096
    finally:
        other.close()


def test_a_zero_local_buffer_refuses_copying_puts(master):
    store = make_store(master, buffer=0)
    try:
        assert store.put("zero-buffer", b"data") == INVALID
        assert store.is_exist("zero-buffer") == 0
        assert store.put_batch(["zero-buffer"], [b"data"]) == INVALID
    finally:
        store.close()


def test_get_after_close_and_setup_sees_the_segment_gone(master):
    store = make_store(master, segment="4MB")
    config = ReplicateConfig()
    config.preferred_segment = store.get_hostname()
    assert store.put("teardown", b"hello", config) == 0
    assert store.close() == 0
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", "4MB", "4MB", "tcp", "", master) == 0
    try:
        assert store.get("teardown") == b""  # its only replica was on the closed store's segment
    finally:
        store.close()


def test_a_dropped_store_closes_before_its_name_is_free(master):
    """SGLang drops stores without close(): the next store may take the name only after the
    first one's client stopped, so two live clients never share a segment name."""
    first = make_store(master)
    name, client = first.get_hostname(), first._client
    segment = client.owner.segment.segment_id
    del first
    gc.collect()
    assert client._stop.is_set()  # closed: no heartbeat
    second = make_store(master, hostname=name)
    try:
        assert second._client.client_id == name  # the name was free again, and only now
        assert segment not in {row["segment_id"] for row in second._client.master.inspect("segments")}
        data = np.arange(4096, dtype=np.uint8)
        assert second.register_buffer(data.ctypes.data, data.nbytes) == 0
        assert second.batch_put_from(["after-drop"], [data.ctypes.data], [data.nbytes]) == [0]
        assert second.get("after-drop") == data.tobytes()
    finally:
        second.close()


def test_two_live_stores_given_one_name_get_distinct_clients(master):
    a, b = make_store(master, hostname="127.0.0.1:13777"), make_store(master, hostname="127.0.0.1:13777")
    try:
        assert a.get_hostname() == b.get_hostname() == "127.0.0.1:13777"
        assert a._client.client_id != b._client.client_id
        assert b.put("same-name", b"ok") == 0 and a.get("same-name") == b"ok"
    finally:
        a.close()
        b.close()


def test_async_store_awaits_every_call(master):
    store = MooncakeDistributedStoreAsync()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", "8MB", "8MB", "tcp", "", master) == 0

    async def scenario():
        assert await store.async_put("async-k", b"v") == 0
        values = await asyncio.gather(store.async_get("async-k"), store.async_is_exist("async-k"))
        assert values == [b"v", 1]
        with pytest.raises(AttributeError):
            getattr(store, "async_no_such_method")  # noqa: B009 - the lookup itself must raise
    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_mooncake_config_reads_files_and_sizes(tmp_path, monkeypatch):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE",
                                "master_server_address": "127.0.0.1:50051", "global_segment_size": "4GB",
                                "protocol": "RDMA", "enable_ssd_offload": "off"}))
    config = MooncakeConfig.from_file(str(path))
    assert config.global_segment_size == 4 << 30 and config.protocol == "rdma" and not config.enable_ssd_offload
    assert config.local_buffer_size == 1 << 30 and config.tenant_id == "default"
    assert _parse_segment_size("1.5kb") == 1536 and _parse_segment_size("1e9") == 10**9
    for bad in ("", "gb", "50%", "inf", "-5"):
        with pytest.raises(ValueError):
            _parse_segment_size(bad)
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    assert MooncakeConfig.load_from_env().local_hostname == "h"


def test_stores_sharing_a_hostname_share_its_segment_name(master):
    """Two live stores set up with one "host:port" (the official tests do): the original knows
    both segments by that name, so clearing by it reaches a replica on either."""
    first = make_store(master, hostname="localhost:12399", segment="4MB", buffer="4MB")
    second = make_store(master, hostname="localhost:12399", segment="4MB", buffer="4MB")
    try:
        assert first.get_hostname() == second.get_hostname() == "localhost:12399"
        config = ReplicateConfig()
        config.preferred_segment = second._client.owner.segment.segment_id  # not first's own
        assert second.put("shared-name", b"on the second", config) == 0
        _wait(first._client.master.inspect("counters")["lease_ttl"])
        assert first.batch_replica_clear(["shared-name"], segment_name=first.get_hostname()) == ["shared-name"]
    finally:
        first.close()
        second.close()
