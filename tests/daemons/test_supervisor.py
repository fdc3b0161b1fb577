"""`mooncake up/status/down` with real daemon processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

SHM = Path("/dev/shm")


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def pids_of(status: dict) -> list[int]:
    return [d["pid"] for d in status["daemons"]]


def test_up_status_down_leaves_nothing_behind(mooncake):
    cluster = mooncake.json("up")
    assert [d["role"] for d in cluster["daemons"]] == ["master", "store-client"]
    written = json.loads((mooncake.workdir / "cluster.json").read_text())
    assert written["daemons"][0]["address"] == cluster["daemons"][0]["address"]
    assert written["daemons"][0]["address"].startswith("tcp://127.0.0.1:")

    status = mooncake.json("status")
    assert status["healthy"] is True
    assert all(d["alive"] and d["healthy"] and d["uptime_s"] >= 0 for d in status["daemons"])
    pids = pids_of(status)
    assert all(psutil.pid_exists(pid) for pid in pids)

    result = mooncake("down")
    assert result.returncode == 0, result.stderr.decode()
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)
    assert list((mooncake.workdir / "run").iterdir()) == []
    assert not (mooncake.workdir / "cluster.json").exists()
    assert not list(SHM.glob(f"mooncake-{cluster['cluster_id']}-*"))
    after = mooncake("status")
    assert after.returncode == 1 and b"no cluster" in after.stderr


def test_killed_daemon_shows_dead_and_status_fails(mooncake):
    cluster = mooncake.json("up")
    master_pid = cluster["daemons"][0]["pid"]
    os.kill(master_pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(master_pid)
               or psutil.Process(master_pid).status() == psutil.STATUS_ZOMBIE)
    result = mooncake("status", "--json")
    assert result.returncode == 1
    master = json.loads(result.stdout)["daemons"][0]
    assert master["alive"] is False and master["healthy"] is False
    assert "killed by a signal" in master["exit_reason"]
    # Its farewells (unmount, withdraw the descriptor) to a master that is gone have short
    # deadlines: the store client exits within `down`'s grace instead of being killed.
    outcome = mooncake.json("down")
    assert outcome["killed"] == []
    assert not list(SHM.glob(f"mooncake-{cluster['cluster_id']}-*"))


def test_sigterm_drains_and_records_why_it_stopped(mooncake):
    cluster = mooncake.json("up")
    os.kill(cluster["daemons"][0]["pid"], signal.SIGTERM)
    wait_until(lambda: mooncake("status").returncode == 1)
    master = json.loads(mooncake("status", "--json").stdout)["daemons"][0]
    assert master["exit_reason"] == "stopped by SIGTERM"


def test_second_up_refuses_and_keeps_the_running_cluster(mooncake):
    first = mooncake.json("up")
    second = mooncake("up")
    assert second.returncode == 1
    assert b"already running" in second.stderr
    status = mooncake.json("status")
    assert pids_of(status) == [d["pid"] for d in first["daemons"]]


def test_up_after_a_crash_cleans_stale_records_and_starts_fresh(mooncake):
    crashed = mooncake.json("up")
    for daemon in crashed["daemons"]:
        os.kill(daemon["pid"], signal.SIGKILL)
    wait_until(lambda: mooncake("status").returncode == 1)
    fresh = mooncake.json("up")
    assert fresh["cluster_id"] != crashed["cluster_id"]
    assert mooncake.json("status")["healthy"] is True


def test_failed_start_names_the_daemon_shows_its_log_and_stops_the_rest(mooncake):
    # 192.0.2.1 (TEST-NET-1) is not an address of this host: binding fails, no packet is sent.
    result = mooncake("up", "--bind-host", "192.0.2.1", "--start-timeout", "10s")
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert "daemon 'master' failed to start" in stderr
    assert "last lines of its log" in stderr and "ZMQError" in stderr
    assert list((mooncake.workdir / "run").iterdir()) == []


def test_down_without_cluster_is_not_an_error(mooncake):
    result = mooncake("down")
    assert result.returncode == 0
    assert b"no cluster" in result.stderr


def test_up_in_a_workdir_that_cannot_be_made_fails_with_a_clear_message(mooncake, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the workdir's parent should be")
    result = mooncake("up", "--workdir", str(blocker / "cluster"))
    assert result.returncode == 1
    err = result.stderr.decode()
    assert "cannot use" in err and "WORKDIR_UNUSABLE" in err and "Traceback" not in err
    assert blocker.read_text().startswith("a file")


def test_a_daemon_name_cannot_reach_outside_the_workdir(mooncake, tmp_path):
    # The name becomes file names: "../../x" once wrote a pidfile, a socket and a log outside it.
    for name in ("../../escaped", "a/b", "..", ".hidden", ""):
        result = mooncake("start", "store-client", "--name", name)
        assert result.returncode != 0 and b"daemon name" in result.stderr, (name, result.stderr)
    outside = [p for p in tmp_path.rglob("*") if mooncake.workdir not in p.parents and p != mooncake.workdir]
    assert not [p for p in outside if "escaped" in p.name]
    assert not (mooncake.workdir / "run").exists() or not list((mooncake.workdir / "run").iterdir())


def test_a_master_restarted_with_start_keeps_the_cluster_and_down_stops_it_last(mooncake):
    """`start master` on a running cluster once wrote a new cluster id listing only the master,
    and `down` then stopped the new master first and SIGKILLed the store client, whose shared
    memory (named by the old id) was left in /dev/shm."""
    cluster = mooncake.json("up", env={"MOONCAKE_STOP_GRACE": "8s"})
    master = cluster["daemons"][0]
    os.kill(master["pid"], signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(master["pid"])
               or psutil.Process(master["pid"]).status() == psutil.STATUS_ZOMBIE)
    port = master["address"].rsplit(":", 1)[1]
    restarted = mooncake.json("start", "master", "--rpc_port", port)
    assert restarted["address"] == master["address"]

    record = json.loads((mooncake.workdir / "cluster.json").read_text())
    assert record["cluster_id"] == cluster["cluster_id"]
    assert [d["name"] for d in record["daemons"]] == [d["name"] for d in cluster["daemons"]]
    assert record["daemons"][0]["pid"] == restarted["pid"]
    wait_until(lambda: mooncake("status").returncode == 0, timeout=15)  # the store client remounted

    outcome = mooncake.json("down")
    assert outcome["killed"] == []
    assert not list(SHM.glob(f"mooncake-{cluster['cluster_id']}-*"))


def test_restart_brings_a_daemon_back_on_its_port_in_the_same_cluster(mooncake):
    cluster = mooncake.json("up")
    client = cluster["daemons"][1]
    restarted = mooncake.json("restart", client["name"])
    assert restarted["address"] == client["address"] and restarted["pid"] != client["pid"]
    assert not psutil.pid_exists(client["pid"]) or psutil.Process(client["pid"]).status() == psutil.STATUS_ZOMBIE
    master = mooncake.json("restart", "master")  # a role with one daemon names it
    record = json.loads((mooncake.workdir / "cluster.json").read_text())
    assert record["cluster_id"] == cluster["cluster_id"]
    assert [(d["name"], d["pid"]) for d in record["daemons"]] == [("master", master["pid"]),
                                                                  (client["name"], restarted["pid"])]
    wait_until(lambda: mooncake("status").returncode == 0, timeout=15)
    unknown = mooncake("restart", "nobody")
    assert unknown.returncode != 0 and b"no daemon named 'nobody'" in unknown.stderr
