"""The busy-poll gate lets a spin start only while the runnable threads fit the cores; the busy
loops `mooncake bench rpc --load` runs beside it never outlive the benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from transfer.rpc.bench import CpuLoad
from transfer.rpc.spin import CROWDED_SAMPLES, CoreHeadroom


def loadavg_file(tmp_path, runnable: int) -> str:
    path = tmp_path / "loadavg"
    path.write_text(f"0.52 0.58 0.59 {runnable}/512 12345\n")
    return str(path)


def test_a_core_free_allows_the_spin_and_a_run_queue_full_in_samples_in_a_row_refuses_it(tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert CoreHeadroom(loadavg_file(tmp_path, cores), interval=0).free()
    gauge = CoreHeadroom(loadavg_file(tmp_path, cores + 1), interval=0)
    assert [gauge.free() for _ in range(CROWDED_SAMPLES + 1)] == [True] * (CROWDED_SAMPLES - 1) + [False, False]
    loadavg_file(tmp_path, cores)  # one free sample ends it
    assert gauge.free()
    # A crowded sample between free ones (a thread running for microseconds) refuses nothing.
    for runnable in (cores + 1, cores, cores + 1, cores):
        loadavg_file(tmp_path, runnable)
        assert gauge.free()


def test_one_sample_serves_until_the_interval_ends(tmp_path):
    path = loadavg_file(tmp_path, 1)
    gauge = CoreHeadroom(path, interval=3600)
    assert gauge.free()
    loadavg_file(tmp_path, 10_000)  # the host got busy: seen only at the next samples
    assert gauge.free()
    busy = CoreHeadroom(path, interval=0)
    assert not [busy.free() for _ in range(CROWDED_SAMPLES)][-1]


def test_a_spin_under_way_samples_now(tmp_path):
    path = loadavg_file(tmp_path, 1)
    gauge = CoreHeadroom(path, interval=3600)
    assert gauge.free() and gauge.free_now()
    loadavg_file(tmp_path, 10_000)
    assert not gauge.free_now()


def test_without_the_kernels_count_every_spin_is_allowed(tmp_path):
    assert CoreHeadroom(str(tmp_path / "absent"), interval=0).free()
    garbled = tmp_path / "garbled"
    garbled.write_text("no fields here\n")
    assert CoreHeadroom(str(garbled), interval=0).free()


def test_cpu_load_hogs_end_with_their_block_or_with_their_parent(tmp_path):
    with CpuLoad(2) as load:
        assert [p.poll() for p in load.processes] == [None, None]
        hogs = list(load.processes)
    assert all(p.returncode is not None for p in hogs)
    # A benchmark killed mid-run: its hog notices the parent is gone and stops by itself.
    pid_file = tmp_path / "hog.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from transfer.rpc.bench import CpuLoad\n"
        "load = CpuLoad(1).__enter__()\n"
        f"open({str(pid_file)!r}, 'w').write(str(load.processes[0].pid))\n"
        "time.sleep(60)")])
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    hog = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    while _alive(hog):
        assert time.monotonic() < deadline, "the hog outlived its parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
