"""Striping over two shaped veth paths between two network namespaces, and failover."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import require_program
from transfer.shm.region import remove_orphans

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
RATE = "40mbit"  # per path: modest, so CPU is never what limits the striped rate

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


@pytest.fixture
def namespaces():
    require_program("ip", "iproute2")
    require_program("tc", "iproute2")
    a, b = f"mc-a-{os.getpid()}", f"mc-b-{os.getpid()}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        for path in ("1", "2"):
            _ip("link", "add", f"mca{path}", "netns", a, "type", "veth", "peer", "name", f"mcb{path}", "netns", b)
            _ip("-n", a, "addr", "add", f"10.77.{path}.1/24", "dev", f"mca{path}")
            _ip("-n", b, "addr", "add", f"10.77.{path}.2/24", "dev", f"mcb{path}")
            _ip("-n", a, "link", "set", f"mca{path}", "up")
            _ip("-n", b, "link", "set", f"mcb{path}", "up")
            subprocess.run(["tc", "-n", a, "qdisc", "add", "dev", f"mca{path}", "root", "tbf", "rate", RATE,
                            "burst", "32kb", "latency", "200ms"], check=True, timeout=10)
        _ip("-n", a, "link", "set", "lo", "up")
        _ip("-n", b, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):  # deleting a namespace deletes its veth ends too
            subprocess.run(["ip", "netns", "del", ns], timeout=10, capture_output=True)


def _in(ns: str, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, os.path.join(HERE, "multipath_main.py"),
                             *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                            stdout=subprocess.PIPE, **kwargs)


def test_striping_beats_one_path_and_survives_a_link_going_down(namespaces):
    a, b = namespaces
    target = _in(b, "target", stdin=subprocess.PIPE)
    try:
        name = json.loads(target.stdout.readline())["name"]
        initiator = _in(a, "initiator", name)
        out, _ = initiator.communicate(timeout=40)
        assert initiator.returncode == 0
        result = json.loads(out)
        assert result["one_path_s"] / result["striped_s"] >= 1.6
        assert result["failover_s"] > 0  # completed (a failure would have raised in the child)
    finally:
        target.kill()
        target.wait(timeout=10)
        target.stdin.close()
        target.stdout.close()
        remove_orphans()  # the killed target could not unlink its shared buffer
