"""mooncake.engine.TransferEngine as vLLM's MooncakeConnector and SGLang's P/D path drive it:
under P2PHANDSHAKE, and through the HTTP metadata server `mooncake start master` runs."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest

from mooncake.engine import TransferEngine
from mooncake.store import MooncakeDistributedStore

NOT_REGISTERED, OVERLAPPED, SEGMENT_NOT_FOUND = -3, -7, -210


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exercise(a: TransferEngine, b: TransferEngine, segment: str) -> None:
    """Every call of the surface, prefill (a) pushing into decode's (b) registered memory."""
    source = (np.arange(1 << 20) % 251).astype(np.uint8)
    target = np.zeros(1 << 20, dtype=np.uint8)
    src, dst = source.ctypes.data, target.ctypes.data
    assert a.transfer_sync_write(segment, src, dst, 100) == NOT_REGISTERED
    assert a.batch_register_memory([src], [source.nbytes]) == 0 and b.register_memory(dst, target.nbytes) == 0
    assert a.register_memory(src + 8, 8) == OVERLAPPED
    assert a.get_first_buffer_address(segment) == dst
    assert a.transfer_sync_write(segment, src, dst, 1 << 20) == 0 and (target == source).all()
    target[:] = 0
    assert a.batch_transfer_sync_write(segment, [src, src + 10], [dst + 100, dst], [10, 20]) == 0
    assert (target[100:110] == source[:10]).all() and (target[:20] == source[10:30]).all()
    batch = a.transfer_submit_write(segment, src, dst + 4096, 4096)
    while (status := a.transfer_check_status(batch)) == 0:
        time.sleep(0.001)
    assert status == 1 and (target[4096:8192] == source[:4096]).all()
    back = np.zeros(64, dtype=np.uint8)
    assert a.register_memory(back.ctypes.data, 64) == 0
    assert a.transfer_sync_read(segment, back.ctypes.data, dst + 100, 10) == 0 and (back[:10] == source[:10]).all()
    batches = [a.batch_transfer_async_write(segment, [src], [dst + 8192], [1000]),
               a.batch_transfer_async_read(segment, [back.ctypes.data], [dst], [64])]
    assert all(batches) and a.get_batch_transfer_status(batches) == 0
    assert (back[:20] == source[10:30]).all() and not back[20:].any()
    assert a.batch_transfer_sync_read(segment, [back.ctypes.data], [dst + (1 << 20)], [8]) < 0  # outside the peer's memory
    assert a.transfer_sync_write("127.0.0.1:1", src, dst, 8) == SEGMENT_NOT_FOUND
    managed = a.allocate_managed_buffer(1 << 16)
    assert managed and a.free_managed_buffer(managed, 1 << 16) == 0 and a.free_managed_buffer(managed, 1 << 16) == -1
    assert json.loads(a.get_local_topology())
    assert a.unregister_memory(src) == 0 and a.unregister_memory(src) == NOT_REGISTERED


def test_p2p_handshake_names_segments_by_rpc_port(monkeypatch):
    monkeypatch.setenv("MOONCAKE_HANDSHAKE_TIMEOUT", "2s")  # exercise() asks a peer that is not there
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        exercise(a, b, f"127.0.0.1:{b.get_rpc_port()}")
    finally:
        a.close()
        b.close()
    assert TransferEngine().initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") == -1


@pytest.mark.parametrize("scheme", ["etcd://", ""])  # the original reads a bare host:port as etcd
def test_etcd_metadata_server_holds_the_segments(tmp_path, scheme, monkeypatch):
    monkeypatch.setenv("MOONCAKE_HANDSHAKE_TIMEOUT", "2s")  # exercise() asks a peer that is not there
    from daemons.ha.etcd_server import EtcdServer
    from tests.conftest import require_program

    require_program("etcd", "etcd-server")
    server = EtcdServer(tmp_path / "etcd")
    a, b = TransferEngine(), TransferEngine()
    try:
        metadata = scheme + server.wait_ready().endpoints
        assert a.initialize("127.0.0.1:17001", metadata, "tcp", "") == 0
        assert b.initialize("127.0.0.1:17002", metadata, "tcp", "") == 0
        exercise(a, b, "127.0.0.1:17002")
    finally:
        a.close()
        b.close()
        server.stop()


@pytest.fixture(scope="module")
def started(tmp_path_factory, secret_env):
    """`mooncake start master` with mooncake_master's flags, in the background."""
    from tests.conftest import Mooncake

    mooncake = Mooncake(tmp_path_factory.mktemp("start") / "master")
    rpc_port, http_port = free_port(), free_port()
    record = mooncake.json("start", "master", f"--rpc_port={rpc_port}", "--default_kv_lease_ttl=500",
                           "--eviction_high_watermark_ratio=0.8", "--enable_http_metadata_server=true",
                           f"--http_metadata_server_port={http_port}", env=secret_env)
    yield record, mooncake
    mooncake("down", timeout=60)


def test_start_master_takes_the_cpp_flags(started):
    record, mooncake = started
    assert record["address"].endswith(f":{record['address'].rsplit(':', 1)[1]}")
    status = mooncake.json("status")
    assert status["healthy"] and status["daemons"][0]["role"] == "master"
    assert mooncake("start", "master").returncode == 1  # one master per workdir
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", record["http_metadata_server"], "16MB", "16MB", "tcp", "",
                       record["address"].removeprefix("tcp://")) == 0
    try:
        assert store.put("leased", b"x") == 0 and store.get("leased") == b"x"
        assert store.remove("leased") == -706
        time.sleep(0.6)  # --default_kv_lease_ttl=500 (ms)
        assert store.remove("leased") == 0
    finally:
        store.close()


def test_engines_find_each_other_through_the_http_metadata_server(started):
    record, _ = started
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize("127.0.0.1:17001", record["http_metadata_server"], "tcp", "") == 0
        assert b.initialize("127.0.0.1:17002", record["http_metadata_server"], "tcp", "") == 0
        exercise(a, b, "127.0.0.1:17002")
    finally:
        a.close()
        b.close()


def test_byte_helpers_probe_and_the_unknown_peer_sentinel(monkeypatch):
    # Nothing answers on port 1: each call to it waits out the RPC deadline, which need not be 5 s.
    monkeypatch.setenv("MOONCAKE_HANDSHAKE_TIMEOUT", "1s")
    a, b = TransferEngine(), TransferEngine()
    try:
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        peer = f"127.0.0.1:{b.get_rpc_port()}"
        assert a.get_first_buffer_address(peer) == 0  # nothing registered there yet
        local = np.zeros(256, dtype=np.uint8)
        assert a.write_bytes_to_buffer(local.ctypes.data, b"hello world", 5) == 0
        assert local[:6].tobytes() == b"hello\0" and a.read_bytes_from_buffer(local.ctypes.data, 5) == b"hello"
        assert a.write_bytes_to_buffer(local.ctypes.data, b"abc", 4) == -1  # longer than the bytes
        assert a.send_probe(peer) == 0 and a.send_probe("127.0.0.1:1") != 0
        # The original reports a submit it could not make as batch id 0, then nothing to poll.
        assert a.transfer_submit_write("127.0.0.1:1", local.ctypes.data, 0, 16) == 0
        assert a.batch_transfer_async_write("127.0.0.1:1", [0], [0], [16]) == 0
    finally:
        a.close()
        b.close()
