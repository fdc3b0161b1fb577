"""The busy-poll gate: it lets a spin start only while the runnable threads fit the cores."""

from __future__ import annotations

import os

from transfer.rpc.spin import CoreHeadroom


def loadavg_file(tmp_path, runnable: int) -> str:
    path = tmp_path / "loadavg"
    path.write_text(f"0.52 0.58 0.59 {runnable}/512 12345\n")
    return str(path)


def test_a_core_free_allows_the_spin_and_a_full_run_queue_refuses_it(tmp_path):
    cores = len(os.sched_getaffinity(0))
    assert CoreHeadroom(loadavg_file(tmp_path, cores), interval=0).free()
    assert not CoreHeadroom(loadavg_file(tmp_path, cores + 1), interval=0).free()


def test_one_sample_serves_until_the_interval_ends(tmp_path):
    path = loadavg_file(tmp_path, 1)
    gauge = CoreHeadroom(path, interval=3600)
    assert gauge.free()
    loadavg_file(tmp_path, 10_000)  # the host got busy: seen only at the next sample
    assert gauge.free()
    assert not CoreHeadroom(path, interval=0).free()


def test_without_the_kernels_count_every_spin_is_allowed(tmp_path):
    assert CoreHeadroom(str(tmp_path / "absent"), interval=0).free()
    garbled = tmp_path / "garbled"
    garbled.write_text("no fields here\n")
    assert CoreHeadroom(str(garbled), interval=0).free()
