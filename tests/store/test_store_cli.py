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


def test_a_bare_soft_pin_takes_the_soft_pin_ttl_flag_or_else_the_masters_default(mooncake):
    assert mooncake("up", env=FAST).returncode == 0
    assert mooncake("put", "flagged", "-", "--soft-pin", "--soft-pin-ttl", "90s", input=b"x", env=FAST).returncode == 0
    assert mooncake("put", "plain", "-", "--soft-pin", input=b"y", env=FAST).returncode == 0
    assert mooncake("put", "valued", "-", "--soft-pin=45s", input=b"z", env=FAST).returncode == 0
    left = {key: mooncake.json("inspect", "key", key, env=FAST)["soft_pin_left"]
            for key in ("flagged", "plain", "valued")}
    assert 60 < left["flagged"] <= 90
    assert 25 * 60 < left["plain"] <= 30 * 60  # the master's soft_pin_ttl default
    assert 15 < left["valued"] <= 45


def test_soft_pin_value_form_is_rewritten_only_for_put_options():
    from mooncake_cli.commands.store import expand_soft_pin_value

    assert expand_soft_pin_value(["put", "k", "f", "--soft-pin=30m"]) == [
        "put", "k", "f", "--soft-pin", "--soft-pin-ttl", "30m"]
    assert expand_soft_pin_value(["put", "--", "--soft-pin=x", "f"]) == ["put", "--", "--soft-pin=x", "f"]
    assert expand_soft_pin_value(["get", "--soft-pin=x"]) == ["get", "--soft-pin=x"]
