"""The same-host fast path: every daemon also serves a Unix stream socket,
``unix://<workdir>/run/<name>.sock``."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import psutil

from daemons.cluster.directory import daemon_address, local_daemon_address
from daemons.cluster.workdir import ClusterPaths
from transfer.rpc.client_server import RpcClient


def test_daemons_announce_a_unix_socket_that_answers_like_tcp(mooncake):
    cluster = mooncake.json("up")
    run = mooncake.workdir / "run"
    for daemon in cluster["daemons"]:
        assert daemon["address"].startswith("tcp://127.0.0.1:")
        assert daemon["ipc_address"] == f"unix://{run / (daemon['name'] + '.sock')}"
        assert daemon["hostname"] == socket.gethostname()
        assert (run / f"{daemon['name']}.sock").is_socket()
        answers = []
        for address in (daemon["address"], daemon["ipc_address"]):
            with RpcClient(address, timeout=5.0, secret=mooncake.secret) as client:
                answers.append((client.call("health"), client.call("echo", {"x": 1})))
        assert answers[0] == answers[1]

    paths = ClusterPaths.of(mooncake.workdir)
    master = cluster["daemons"][0]
    assert daemon_address(paths, "master") == master["address"]
    assert local_daemon_address(paths, "master") == master["ipc_address"]

    # The CLI's store client reaches the master over the socket: a put and a get go through it.
    put = mooncake("put", "ipc-key", "-", input=b"over a unix socket")
    assert put.returncode == 0, put.stderr.decode()
    got = mooncake("get", "ipc-key")
    assert got.returncode == 0 and got.stdout == b"over a unix socket"


def test_another_host_reading_the_workdir_keeps_tcp(mooncake):
    mooncake.json("up")
    cluster_file = mooncake.workdir / "cluster.json"
    cluster = json.loads(cluster_file.read_text())
    for daemon in cluster["daemons"]:
        daemon["hostname"] = "some-other-host"
    cluster_file.write_text(json.dumps(cluster))
    paths = ClusterPaths.of(mooncake.workdir)
    assert local_daemon_address(paths, "master") == daemon_address(paths, "master")


def wait_exited(pid: int) -> None:
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} is still running"
        time.sleep(0.05)


def test_a_stopped_daemon_unlinks_its_socket_and_down_removes_a_killed_ones(mooncake):
    cluster = mooncake.json("up")
    run = mooncake.workdir / "run"
    master, store_client = cluster["daemons"]
    os.kill(store_client["pid"], signal.SIGTERM)
    wait_exited(store_client["pid"])
    assert not (run / f"{store_client['name']}.sock").exists()
    os.kill(master["pid"], signal.SIGKILL)
    wait_exited(master["pid"])
    assert (run / f"{master['name']}.sock").exists(), "a killed daemon cannot unlink its socket"
    result = mooncake("down")
    assert result.returncode == 0, result.stderr.decode()
    assert list(run.iterdir()) == []
