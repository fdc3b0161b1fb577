"""The SSD tier with real daemons: a segment too small for what is put evicts to disk, every
object stays readable byte for byte, and one read twice from disk comes back into memory."""

from __future__ import annotations

import json
import os
import signal

import psutil
import xxhash

from daemons import supervisor
from transfer.auth import read_secret_file, secret_file
from transfer.rpc.client_server import RpcClient

from store_cluster import FAST, client_for, config_for, paths_of, value_for, wait_until

SIZE = 256 * 1024
COUNT = 40  # 10 MiB into an 8 MiB segment


def tiers(client, key) -> list[str]:
    return [r["tier"] for r in client.master.inspect("key", key)["replicas"]]


def test_evicted_objects_are_read_back_from_disk_and_promoted_after_two_reads(mooncake, tmp_path):
    ssd = tmp_path / "ssd"
    mooncake.json("up", env={**FAST, "MOONCAKE_OFFLOAD_DIR": str(ssd), "MOONCAKE_OFFLOAD_POLICY": "all"})
    keys = [f"obj-{i}" for i in range(COUNT)]
    with client_for(mooncake.workdir) as client:
        for key in keys:
            client.put(key, value_for(key, SIZE))
            # The owner copies it to disk on its next ping (every 100 ms), before it can be evicted.
            wait_until(lambda: "LOCAL_DISK" in tiers(client, key), timeout=5)  # noqa: B023 (waited on here)
        counters = client.master.inspect()
        assert counters["num_evicted_to_disk"] > 0 and counters["num_objects"] == COUNT
        files = list(ssd.rglob("*.obj"))  # others' cached data: readable by this user only
        assert files and {f.stat().st_mode & 0o777 for f in files} == {0o600}
        assert {f.parent.stat().st_mode & 0o777 for f in files} == {0o700}
        on_disk_only = [k for k in keys if tiers(client, k) == ["LOCAL_DISK"]]
        assert on_disk_only
        for key in keys:
            assert bytes(client.get(key)) == value_for(key, SIZE)

        # The first reads above were one disk read each; the second asks for promotion.
        key = next(k for k in on_disk_only if tiers(client, k) == ["LOCAL_DISK"])
        assert bytes(client.get(key)) == value_for(key, SIZE)
        assert tiers(client, key) == ["MEMORY", "LOCAL_DISK"]
        assert bytes(client.get(key)) == value_for(key, SIZE)
        assert client.master.inspect()["num_promoted"] >= 1

        client.remove(key, force=True)
        wait_until(lambda: len(list(ssd.rglob("*.obj"))) == COUNT - 1, timeout=5)
    mooncake("down")
    assert not list(ssd.rglob("*.obj"))  # the owner's files leave with its segment


def test_with_policy_evicted_only_evicted_objects_reach_disk_and_read_back_exactly(mooncake, tmp_path):
    ssd = tmp_path / "ssd"
    mooncake.json("up", env={**FAST, "MOONCAKE_OFFLOAD_DIR": str(ssd)})  # offload_policy: evicted
    keys = [f"obj-{i}" for i in range(COUNT)]
    with client_for(mooncake.workdir) as client:
        for key in keys:
            client.put(key, value_for(key, SIZE))
            # Let the background pass hand its victims over and their owner copy them, so no put
            # has to evict a victim before its copy is made.
            wait_until(lambda: client.master.inspect()["used_ratio"] <= 0.9
                       and client.master.inspect()["num_offload_pending"] == 0, timeout=5)
        counters = client.master.inspect()
        assert counters["num_objects"] == COUNT and counters["num_offload_timeouts"] == 0
        on_disk = {k for k in keys if tiers(client, k) == ["LOCAL_DISK"]}
        in_memory = {k for k in keys if tiers(client, k) == ["MEMORY"]}
        assert on_disk and in_memory and on_disk | in_memory == set(keys)
        files = {p.name for p in ssd.rglob("*.obj")}
        assert files == {f"{xxhash.xxh3_128_hexdigest(k.encode())}.obj" for k in on_disk}
        for key in keys:
            assert bytes(client.get(key)) == value_for(key, SIZE)

        # A restarted master learns the objects held only on disk from their owner's remount.
        paths = paths_of(mooncake.workdir)
        # First the owner's record must catch up on its pings (the known gap, see segment_journal).
        wait_until(lambda: _owner_status(paths)["num_objects"] == len(in_memory))
        master_pid = int(json.loads(paths.announce_file("master").read_text())["pid"])
        os.kill(master_pid, signal.SIGKILL)
        wait_until(lambda: not psutil.pid_exists(master_pid)
                   or psutil.Process(master_pid).status() == psutil.STATUS_ZOMBIE)
        supervisor.restart(paths, "master", config_for(mooncake.workdir))
        wait_until(lambda: client.master.inspect()["num_objects"] == COUNT, timeout=10)
        assert {k for k in keys if tiers(client, k) == ["LOCAL_DISK"]} == on_disk
        for key in on_disk:
            assert bytes(client.get(key)) == value_for(key, SIZE)
    # The restarted master is this process's child: stop it from here, so it is reaped at once.
    supervisor.down(paths, grace=3.0)


def _owner_status(paths) -> dict:
    address = json.loads(paths.announce_file("store-client-0").read_text())["address"]
    with RpcClient(address, timeout=2, secret=read_secret_file(secret_file(paths.workdir))) as rpc:
        return rpc.call("status")
