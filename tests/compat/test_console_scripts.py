"""The original wheel's console scripts: the official CI's `mooncake_master` start line runs our
master in the foreground, stores set up against it, and SIGTERM stops it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from mooncake.cli import FlagError, client_args, master_args
from mooncake.store import MooncakeDistributedStore
from tests.conftest import REPO
from tests.compat.test_transfer_engine import free_port

SCRIPT = ("import sys; sys.path.insert(0, {compat!r}); from mooncake.cli import {main}; "
          "sys.exit({main}())")


def run_script(main: str, args: list[str], env: dict) -> subprocess.Popen:
    code = SCRIPT.format(compat=str(REPO / "compat"), main=main)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_flags_map_to_our_commands():
    assert master_args(["--rpc_port=50051", "--default_kv_lease_ttl=500", "--enable_http_metadata_server=true",
                        "--http_metadata_server_port", "8080", "--max_threads=4", "-cluster_id=x",
                        "--metrics_port=9100"]) == [
        "start", "master", "--foreground", "--rpc_port", "50051", "--default_kv_lease_ttl", "500",
        "--enable_http_metadata_server", "--http_metadata_server_port", "8080", "--metrics-port", "9100"]
    assert "--enable_http_metadata_server" not in master_args(["--enable_http_metadata_server=false"])
    with pytest.raises(FlagError):
        master_args(["--no_such_flag=1"])
    assert client_args(["--master_server_address=10.0.0.1:50051", "--global_segment_size=1 GB", "--port=50052"]) == [
        "start", "store-client", "--foreground", "--master", "tcp://10.0.0.1:50051", "--segment-size", str(1 << 30),
        "--port", "50052"]
    assert client_args([])[-2:] == ["--port", "50052"]  # where the original's dummy clients look


def test_the_official_ci_start_line_serves_until_sigterm(tmp_path):
    rpc, http, metrics = free_port(), free_port(), free_port()
    env = {**os.environ, "MOONCAKE_WORKDIR": str(tmp_path / "wd"), "PYTHONPATH": str(REPO)}
    # --metrics_port: the default, 9003, may be held by another master on this machine.
    master = run_script("master_main", ["--default_kv_lease_ttl=500", "--eviction_high_watermark_ratio=0.95",
                                        "--cluster_id=ci_test_cluster", "--port", str(rpc),
                                        "--enable_http_metadata_server=true",
                                        f"--http_metadata_server_port={http}", f"--metrics_port={metrics}"], env)
    try:
        store = MooncakeDistributedStore()
        deadline = time.monotonic() + 60
        while store.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", "4MB", "4MB", "tcp", "",
                          f"127.0.0.1:{rpc}") != 0:
            assert master.poll() is None and time.monotonic() < deadline, master.stdout.read()
            time.sleep(0.2)
        assert store.put("ci-line", b"ok") == 0 and store.get("ci-line") == b"ok"
        store.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/role", timeout=10) as answer:
            assert answer.read() == b"leader"
    finally:
        master.send_signal(signal.SIGTERM)
        output = master.communicate(timeout=60)[0]
    assert master.returncode == 0, output
    assert "cluster_id" in output  # named as accepted without effect


def test_a_dummy_client_finds_the_pool_through_the_real_clients_port(master, tmp_path):
    """The official standalone layout: `mooncake_client --port=P` owns the pool and
    setup_dummy(..., "127.0.0.1:P") is all a dummy is told; its alloc_from_mem_pool memory
    serves the zero-copy calls."""
    port = free_port()
    env = {**os.environ, "MOONCAKE_WORKDIR": str(tmp_path / "wd"), "PYTHONPATH": str(REPO)}
    real = run_script("client_main", [f"--master_server_address={master}", "--global_segment_size=8MB",
                                      f"--port={port}"], env)
    dummy = MooncakeDistributedStore()
    try:
        deadline = time.monotonic() + 60
        while dummy.setup_dummy(64 << 20, 1 << 20, f"127.0.0.1:{port}") != 0:
            assert real.poll() is None and time.monotonic() < deadline, real.stdout.read()
            time.sleep(0.2)
        first, second = dummy.alloc_from_mem_pool(4096), dummy.alloc_from_mem_pool(4096)
        assert first and second >= first + 4096 and first % 64 == 0
        assert dummy.alloc_from_mem_pool(64 << 20) == 0  # more than is left
        assert dummy.register_buffer(first, 8192) == 0
        ctypes.memmove(first, b"from the pool", 13)
        assert dummy.put_from("dummy-zero-copy", first, 13) == 0
        assert dummy.get_into("dummy-zero-copy", second, 4096) == 13
        assert ctypes.string_at(second, 13) == b"from the pool"
        assert dummy.unregister_buffer(first) == 0 and dummy.remove("dummy-zero-copy", force=True) == 0
    finally:
        dummy.close()
        real.send_signal(signal.SIGTERM)
        output = real.communicate(timeout=60)[0]
    assert real.returncode == 0, output


def test_a_store_set_up_with_its_own_segment_has_no_mem_pool(store):
    assert store.alloc_from_mem_pool(4096) == 0
