"""Every role started on its own "host" (its own workdir, nothing shared but the master's address):
the conductor registers with the master, the workers and `mooncake generate` find it there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from daemons.cluster.service_registry import REFRESH_INTERVAL, ServiceRegistration, lookup_service
from daemons.errors import ServiceNotRegistered
from daemons.model import ByteTokenizer
from tests.daemons.serving.helpers import Reference

SMALL = {"MOONCAKE_KV_BLOCK_TOKENS": "32", "MOONCAKE_KV_CACHE_SIZE": "16MiB", "MOONCAKE_SEGMENT_SIZE": "64MiB",
         "MOONCAKE_CALIBRATION_TIME": "1ms"}  # the fewest profile shapes: costs are not what these test
ROLES = ("store-client", "conductor", "prefill", "decode")


def test_roles_on_separate_hosts_serve_through_the_master(mooncake, tmp_path):
    hosts = {role: tmp_path / role for role in ("master", *ROLES)}
    pids = []
    try:
        started = mooncake.json("start", "master", "--rpc_port", "0", "--workdir", str(hosts["master"]), env=SMALL)
        master = started["address"]
        pids.append(started["pid"])
        for role in ROLES:
            record = mooncake.json("start", role, "--master", master, "--workdir", str(hosts[role]), env=SMALL)
            pids.append(record["pid"])
        # Each host named a cluster id of its own, which names the shared memory it creates.
        prefixes = tuple(f"mooncake-{json.loads((d / 'cluster.json').read_text())['cluster_id']}-"
                         for d in hosts.values())
        text = "Mooncake on many hosts"
        result = mooncake("generate", "--master", master, text, "--max-tokens", "8", "--json", env=SMALL)
        assert result.returncode == 0, result.stderr.decode()
        answer = json.loads(result.stdout)
        assert answer["token_ids"] == Reference().tokens(ByteTokenizer().encode(text), 8)
        assert answer["prefill"] == "prefill" and answer["decode"] == "decode"
    finally:
        for workdir in reversed(hosts.values()):
            mooncake("down", "--workdir", str(workdir))
    assert not [pid for pid in pids if _running(pid)]
    assert not [path for workdir in hosts.values() for path in (workdir / "run").glob("*.pid")]
    assert not [shm for shm in Path("/dev/shm").iterdir() if shm.name.startswith(prefixes)]


def test_generate_through_a_master_without_a_conductor_says_so(mooncake):
    master = mooncake.json("start", "master", "--rpc_port", "0")["address"]
    result = mooncake("generate", "--master", master, "hello")
    assert result.returncode == 1 and b"SERVICE_NOT_REGISTERED" in result.stderr


def test_a_registration_comes_back_after_the_master_restarts(mooncake):
    master = mooncake.json("start", "master", "--rpc_port", "0")["address"]
    record = {"name": "conductor", "address": "tcp://10.0.0.7:4000", "http_address": "http://10.0.0.7:8000"}
    registration = ServiceRegistration(master, record, timeout=2.0)
    try:
        registration.refresh(strict=True)
        assert lookup_service(master, "conductor", 2.0) == record
        # A restarted master (as a new HA leader) starts with an empty table...
        assert mooncake("down").returncode == 0
        mooncake.json("start", "master", "--rpc_port", master.rpartition(":")[2])
        with pytest.raises(ServiceNotRegistered):
            lookup_service(master, "conductor", 2.0)
        # ...until the next periodic refresh.
        registration.tick(time.monotonic() + REFRESH_INTERVAL)
        assert lookup_service(master, "conductor", 2.0) == record
    finally:
        registration.close()


def _running(pid: int) -> bool:
    """Alive and not a zombie: our daemons' parent exited, and whoever inherited them may reap late."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
