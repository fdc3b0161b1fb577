"""Four hosts in network namespaces: etcd + master A, master B, store clients C and D.

SIGKILL the leader -> B leads within 10 s, every object is readable, new puts succeed. Cut C's
link -> C's objects leave the master after the client TTL, D's stay readable, no get returns
wrong bytes. Restore it -> C re-registers and its objects return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemons.cluster.workdir import read_json
from daemons.ha.etcd_server import EtcdServer
from daemons.ha.failover_scenario import Cluster, scenario_settings, wait_until
from tests.conftest import require_program

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces")]
N = 200
NODES = "abcd"


def ip(*args: str, ns: str | None = None) -> None:
    subprocess.run([*(["ip", "netns", "exec", ns] if ns else []), "ip", *args], check=True, capture_output=True)


@pytest.fixture
def hosts():
    """Namespaces <tag>-a..d on a bridge inside a hub namespace; 10.77.0.1..4. Always removed."""
    require_program("ip", "iproute2")
    require_program("etcd", "etcd-server")
    tag = f"mc{os.getpid() % 100000}"
    hub = f"{tag}-hub"
    created = []
    try:
        ip("netns", "add", hub)
        created.append(hub)
        ip("link", "add", "br0", "type", "bridge", ns=hub)
        ip("link", "set", "br0", "up", ns=hub)
        for i, node in enumerate(NODES, 1):
            ns = f"{tag}-{node}"
            ip("netns", "add", ns)
            created.append(ns)
            ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{node}", "netns", hub, ns=hub)
            ip("link", "set", f"p{node}", "master", "br0", "up", ns=hub)
            ip("addr", "add", f"10.77.0.{i}/24", "dev", "eth0", ns=ns)
            ip("link", "set", "eth0", "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)
        yield {node: (f"{tag}-{node}", f"10.77.0.{i}") for i, node in enumerate(NODES, 1)} | {"hub": hub}
    finally:
        for ns in reversed(created):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_failover_and_partition_across_namespaces(hosts, tmp_path):
    (ns_a, ip_a), (ns_b, ip_b), (ns_c, ip_c), (ns_d, ip_d) = (hosts[n] for n in NODES)
    on = lambda ns: ["ip", "netns", "exec", ns]  # noqa: E731
    etcd = EtcdServer(tmp_path / "etcd", host=ip_a, client_port=2379, prefix=on(ns_a))
    cluster = None
    driver = None
    try:
        settings = scenario_settings(f"{ip_a}:2379", "netns", ttl=2.0)
        cluster = Cluster(tmp_path / "cluster", settings)
        a = cluster.spawn("master", "master-a", on(ns_a), bind_host=ip_a)
        # The view is read from inside a namespace: this test process cannot reach them.
        leader = lambda: subprocess.run(  # noqa: E731
            [*on(ns_d), sys.executable, "-c", "import sys; from transfer.etcd.leader import MasterView; "
             "print(MasterView(sys.argv[1]).leader())", settings["master"]],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3]).stdout.strip()
        wait_until(lambda: leader().startswith(f"tcp://{ip_a}:"), 20, "A leading", step=0.2)
        cluster.spawn("master", "master-b", on(ns_b), bind_host=ip_b)
        cluster.spawn("store-client", "store-client-c", on(ns_c), bind_host=ip_c)
        cluster.spawn("store-client", "store-client-d", on(ns_d), bind_host=ip_d)
        # Both segments mounted before any put (a client announces itself once set up): on a
        # loaded host C could still be starting when the puts ran, and hold none of them.
        announced = lambda name: read_json(cluster.root / name / "run" / f"{name}.json")  # noqa: E731
        wait_until(lambda: announced("store-client-c") and announced("store-client-d"), 30,
                   "both store clients announced", step=0.1)
        driver = subprocess.Popen([*on(ns_d), sys.executable, str(Path(__file__).with_name("ns_driver.py")),
                                   settings["master"], ip_d, str(cluster.root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, cwd=Path(__file__).resolve().parents[3],
                                  env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})

        def ask(command: str) -> dict:
            driver.stdin.write(command + "\n")
            driver.stdin.flush()
            line = driver.stdout.readline()
            assert line, f"the driver exited (code {driver.poll()}) before answering {command!r}: see its stderr"
            return json.loads(line)

        ask(f"put {N}")
        a.kill()  # at once: the op log in etcd holds every acknowledged object
        took = ask("put_one after-kill")["seconds"]
        assert took < 10, f"no put succeeded within 10 s of the kill ({took:.1f}s)"
        assert leader().startswith(f"tcp://{ip_b}:")
        wait_until(lambda: ask(f"check {N}")["present"] == N, 15, "every object back after failover", step=0.3)
        assert ask(f"check {N}")["wrong"] == 0
        print(f"netns failover: SIGKILL -> first good put {took:.2f}s")
        # B knows every object from the op log before any owner re-registers. Cut C before it has
        # re-registered and heard of every object in its segment, and B drops the ones it never
        # heard of for good once C is silent for the TTL: after the partition only what an owner
        # holds a record of comes back, so wait until the owners together know all N (+ the put).
        owners = ",".join(announced(name)["address"] for name in ("store-client-c", "store-client-d"))
        wait_until(lambda: ask(f"owned {owners}")["objects"] == N + 1, 15, "the owners hearing of every object",
                   step=0.3)

        ip("link", "set", "pc", "down", ns=hosts["hub"])  # cut C off
        wait_until(lambda: ask(f"check {N}")["present"] < N, 15, "C's objects leaving", step=0.3)
        partitioned = ask(f"check {N}")
        assert 0 < partitioned["present"] < N and partitioned["wrong"] == 0  # D's stay, never wrong bytes
        ip("link", "set", "pc", "up", ns=hosts["hub"])
        wait_until(lambda: ask(f"check {N}")["present"] == N, 20, "C's objects returning", step=0.3)
        assert ask(f"check {N}")["wrong"] == 0
        assert ask("put_one after-heal")["seconds"] < 10
    finally:
        if driver is not None:
            driver.kill()
            driver.wait(timeout=10)
        if cluster is not None:
            cluster.close()
        etcd.stop()
