"""A store client commits its segment's memory when it mounts it (segment_prefault, on by default):
every page is taken before the first put, and a /dev/shm too small fails the start clearly."""

from __future__ import annotations

import os
import shutil

from store_cluster import FAST

SHM = "/dev/shm"


def _segment_files(pid: int) -> list[str]:
    return [name for name in os.listdir(SHM) if name.startswith("mooncake-") and f"-{pid}-" in name]


def test_up_commits_each_store_segment_before_any_put(mooncake):
    up = mooncake("up", "--segment-size", "64MiB", env={**FAST, "MOONCAKE_SEGMENT_PREFAULT": "true"})
    assert up.returncode == 0, up.stderr.decode()
    # The flag outranks FAST's MOONCAKE_SEGMENT_SIZE=8MiB in the daemons too (they once read
    # the environment above the settings `up` resolved).
    (mounted,) = mooncake.json("inspect", "segments", env=FAST)
    assert mounted["capacity_bytes"] == 64 << 20
    daemons = {d["name"]: d for d in mooncake.json("status")["daemons"]}
    (segment,) = _segment_files(daemons["store-client-0"]["pid"])
    assert os.stat(os.path.join(SHM, segment)).st_blocks * 512 == 64 << 20


def test_without_prefault_the_segment_takes_memory_only_as_objects_are_written(mooncake):
    up = mooncake("up", "--segment-size", "64MiB", "--no-segment-prefault", env=FAST)
    assert up.returncode == 0, up.stderr.decode()
    daemons = {d["name"]: d for d in mooncake.json("status")["daemons"]}
    (segment,) = _segment_files(daemons["store-client-0"]["pid"])
    assert os.stat(os.path.join(SHM, segment)).st_blocks == 0


def test_a_segment_larger_than_free_shared_memory_fails_the_start_and_says_why(mooncake):
    too_big = shutil.disk_usage(SHM).free + (1 << 30)
    up = mooncake("up", "--segment-size", str(too_big), env={**FAST, "MOONCAKE_SEGMENT_PREFAULT": "true"})
    assert up.returncode == 1
    message = up.stderr.decode()
    assert "store-client-0" in message and f"too few for {too_big:,} bytes" in message
    assert "--segment-size" in message
