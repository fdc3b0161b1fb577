"""`mooncake put/get/exists/rm/inspect` against a real master and store-client daemon."""

from __future__ import annotations

import json
import os

from store_cluster import FAST


def test_put_get_exists_rm_inspect_round_trip(mooncake, tmp_path):
    # A lease long enough to outlast the commands below even on a loaded machine.
    assert mooncake("up", env={**FAST, "MOONCAKE_LEASE_TTL": "120s"}).returncode == 0
    blob = bytes(range(256)) * 4096 + b"\x00\r\n\xff"  # 1 MiB of every byte value, binary-safe
    put = mooncake("put", "blob", "-", "--soft-pin=10m", input=blob, env=FAST)
    assert put.returncode == 0, put.stderr.decode()

    got = mooncake("get", "blob", env=FAST)
    assert got.returncode == 0 and got.stdout == blob
    out = tmp_path / "out.bin"
    assert mooncake("get", "blob", "-o", str(out), env=FAST).returncode == 0
    assert out.read_bytes() == blob

    assert mooncake("exists", "blob", env=FAST).returncode == 0
    missing = mooncake("exists", "nope", env=FAST)
    assert missing.returncode == 1

    again = mooncake("put", "blob", "-", input=b"other", env=FAST)
    assert again.returncode == 1 and b"OBJECT_ALREADY_EXISTS" in again.stderr

    obj = mooncake.json("inspect", "key", "blob", env=FAST)
    assert obj["state"] == "COMPLETE" and obj["size"] == len(blob)
    assert obj["soft_pin_left"] > 500 and obj["lease_left"] > 0  # our get leased it
    segments = mooncake.json("inspect", "segments", env=FAST)
    assert len(segments) == 1 and segments[0]["capacity_bytes"] == 8 << 20
    clients = mooncake.json("inspect", "clients", env=FAST)
    assert any(c["registered"] and c["segments"] for c in clients)
    counters = mooncake.json("inspect", env=FAST)
    assert counters["num_objects"] == 1 and counters["num_put_ends"] == 1

    leased = mooncake("rm", "blob", env=FAST)
    assert leased.returncode == 1 and b"OBJECT_HAS_LEASE" in leased.stderr
    assert mooncake("rm", "blob", "--force", env=FAST).returncode == 0
    gone = mooncake("get", "blob", env=FAST)
    assert gone.returncode == 1 and b"OBJECT_NOT_FOUND" in gone.stderr and gone.stdout == b""


def test_up_writes_the_topology_and_names_shm_for_the_cluster(mooncake):
    cluster = mooncake.json("up", env=FAST)
    assert [d["role"] for d in cluster["daemons"]] == ["master", "store-client"]
    matrix = json.loads((mooncake.workdir / "topology.json").read_text())
    assert matrix and all(len(v) == 2 for v in matrix.values())
    prefix = f"mooncake-{cluster['cluster_id']}-"
    assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    mooncake("down")
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
