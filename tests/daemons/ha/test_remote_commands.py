"""Commands pointed at a cluster on other hosts with --master alone: `status`, `bench store`,
`bench serve` and `generate --demo` learn everything (daemons, segments, the KV block size) from
the master and what registered with it, nothing from the caller's workdir; and the master stops
handing out a service that went silent."""

from __future__ import annotations

import json
import socket
import time

import pytest

from daemons.cluster.service_registry import (SERVICE_FORGET_AFTER, SERVICE_TTL, ServiceRegistration, ServiceTable,
                                              lookup_service)
from daemons.errors import ServiceNotRegistered
from transfer.errors import InvalidArgument, TableFull
from tests.conftest import Mooncake

# The cluster's block size differs from the default (512), which is what a caller without the
# cluster's settings would otherwise use.
CLUSTER = {"MOONCAKE_KV_BLOCK_TOKENS": "32", "MOONCAKE_KV_CACHE_SIZE": "16MiB", "MOONCAKE_SEGMENT_SIZE": "16MiB",
           "MOONCAKE_CALIBRATION_TIME": "1ms"}  # the fewest profile shapes: costs are not what these test
ROLES = ("store-client", "conductor", "prefill", "decode")


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A master and one daemon of each role, each in a workdir ("host") of its own; yields the
    master's address and a runner whose workdir holds no cluster and no settings."""
    root = tmp_path_factory.mktemp("hosts")
    hosts = {role: Mooncake(root / role) for role in ("master", *ROLES)}
    try:
        master = hosts["master"].json("start", "master", "--rpc_port", "0", env=CLUSTER)["address"]
        for role in ROLES:
            hosts[role].json("start", role, "--master", master, env=CLUSTER)
        yield master, Mooncake(root / "elsewhere")
    finally:
        for host in reversed(hosts.values()):
            host("down")


def test_status_through_the_master_lists_every_daemon_alive(remote):
    master, mooncake = remote
    result = mooncake("status", "--master", master, "--json")
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout)
    assert data["healthy"] is True
    assert data["master"]["address"] == master and data["master"]["leading"] is None
    by_role = {d["role"]: d for d in data["daemons"]}
    assert set(by_role) == {"master", "store-client", "conductor"}
    assert all(d["alive"] for d in data["daemons"])
    # Two store clients hold segments: the store-client daemon (the pool) and the prefill worker,
    # whose instance-local cache is a segment of prefill_segment_size (256 MiB by default).
    clients = {d["segments"][0]["capacity_bytes"]: d for d in data["daemons"] if d["role"] == "store-client"}
    assert sorted(clients) == [16 * 2**20, 256 * 2**20]
    assert clients[256 * 2**20]["name"].startswith("prefill")
    store = clients[16 * 2**20]
    assert store["address"] == store["segments"][0]["endpoint"]
    assert 0 <= store["last_seen_ago"] < 5
    assert by_role["conductor"]["address"].startswith("tcp://")


def test_bench_store_through_the_master_measures_both_placements_and_keeps_others_objects(remote):
    master, mooncake = remote
    assert mooncake("put", "--master", master, "not-the-bench's", input=b"keep me").returncode == 0
    before = mooncake.json("inspect", "--master", master)["num_put_ends"]
    result = mooncake("bench", "store", "--master", master, "--sizes", "4KiB", "--duration", "0.05",
                      "--budget", "64KiB", "--batch", "4", "--json")
    assert result.returncode == 0, result.stderr.decode()
    cells = json.loads(result.stdout)
    assert {(c["topology"], c["op"], c["mode"]) for c in cells} == {
        (t, op, mode) for t in ("remote", "local") for op in ("put", "get") for mode in ("single", "batch")}
    assert all(c["ops"] > 0 for c in cells)
    # The remote cluster's master saw every put: no cluster of the bench's own was measured.
    # Each put cell writes twice, untimed first, each pass up to its budget (16 objects) or its
    # 0.05 s, whichever ends first: a loaded machine may end either pass early.
    after = mooncake.json("inspect", "--master", master)["num_put_ends"]
    puts = [c["ops"] for c in cells if c["op"] == "put"]
    assert sum(puts) + len(puts) <= after - before <= 2 * 16 * len(puts)
    kept = mooncake("get", "--master", master, "not-the-bench's")
    assert kept.returncode == 0 and kept.stdout == b"keep me"


def test_generate_demo_through_the_master_uses_the_cluster_block_size(remote):
    master, mooncake = remote
    result = mooncake("generate", "--demo", "--master", master, "--max-tokens", "2", "--json")
    assert result.returncode == 0, result.stderr.decode()
    first, second = json.loads(result.stdout)
    # 3.5 blocks of 32 tokens plus a question: far below one block of the default 512.
    assert first["prompt_tokens"] < 200
    assert second["prefix_tokens"] > 0 and second["prefix_tokens"] % 32 == 0


def test_bench_serve_through_the_master_uses_the_cluster_block_size(remote, tmp_path):
    master, mooncake = remote
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 2,
                                         "hash_ids": [0, i]}) + "\n" for i in (1, 2)))
    result = mooncake("bench", "serve", "--master", master, "--trace", str(trace), "--max-tokens", "2",
                      "--json")
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout)
    assert data["block_tokens"] == 32
    assert [run["completed"] for run in data["runs"]] == [2, 2]


def test_status_through_the_master_flags_a_service_that_went_silent(mooncake):
    master = mooncake.json("start", "master", "--rpc_port", "0")["address"]
    registration = ServiceRegistration(master, {"name": "conductor", "address": "tcp://10.0.0.7:4000"}, 2.0)
    try:
        registration.refresh(strict=True)
        assert mooncake("status", "--master", master).returncode == 0
    finally:
        registration.close()
    time.sleep(SERVICE_TTL)
    result = mooncake("status", "--master", master, "--json")
    assert result.returncode == 1
    (conductor,) = [d for d in json.loads(result.stdout)["daemons"] if d["role"] == "conductor"]
    assert conductor["alive"] is False and conductor["last_seen_ago"] > SERVICE_TTL
    with pytest.raises(ServiceNotRegistered, match="went silent"):
        lookup_service(master, "conductor", 2.0)


def test_status_of_an_unreachable_master_fails_fast_with_a_message(mooncake):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once the probe closes
    began = time.monotonic()
    result = mooncake("status", "--master", f"127.0.0.1:{port}", "--rpc-timeout", "1s", "--json")
    assert time.monotonic() - began < 10
    assert result.returncode == 1 and result.stdout == b""
    assert b"cannot read the cluster from the master" in result.stderr and b"Traceback" not in result.stderr


def test_service_table_stops_handing_out_a_record_once_it_went_silent():
    now = [100.0]
    table = ServiceTable(clock=lambda: now[0])
    record = {"name": "conductor", "address": "tcp://10.0.0.7:4000"}
    table.put(record)
    now[0] += SERVICE_TTL
    assert table.lookup("conductor") == record
    assert table.listing() == [{"record": record, "last_seen_ago": SERVICE_TTL, "alive": True}]
    now[0] += 0.5
    with pytest.raises(ServiceNotRegistered, match="went silent"):
        table.lookup("conductor")
    assert table.listing()[0]["alive"] is False
    table.put(record)  # the daemon's next refresh brings it back
    assert table.lookup("conductor") == record
    with pytest.raises(ServiceNotRegistered, match="no decode registered"):
        table.lookup("decode")


def test_status_through_etcd_names_the_elected_leader(mooncake, etcd):
    started = mooncake.json("start", "master", "--rpc_port", "0", "--ha-backend", "etcd",
                            "--etcd-endpoints", etcd.endpoints, "--cluster-id", "remote-status")
    result = mooncake("status", "--master", f"etcd://{etcd.endpoints}/remote-status", "--json")
    assert result.returncode == 0, result.stderr.decode()
    master = json.loads(result.stdout)["master"]
    assert master["address"] == started["address"] and master["leading"] is True


def test_service_table_is_bounded_forgets_long_silent_names_and_refuses_bad_records():
    now = [100.0]
    table = ServiceTable(clock=lambda: now[0], max_entries=2)
    table.put({"name": "a", "address": "x"})
    table.put({"name": "b", "address": "x"})
    with pytest.raises(TableFull):
        table.put({"name": "c", "address": "x"})
    table.put({"name": "b", "address": "y"})  # a known name is still refreshed
    now[0] += SERVICE_FORGET_AFTER + 1
    table.put({"name": "c", "address": "x"})  # the long-silent ones made room
    assert [e["record"]["name"] for e in table.listing()] == ["c"]
    for bad in ({"address": "x"}, {"name": 7}, {"name": "d", "blob": "x" * 10_000}):
        with pytest.raises(InvalidArgument):
            table.put(bad)
