"""A failover scenario with real processes: etcd, two masters, a store client, and a library client.

`mooncake bench failover` and the HA tests run it. Each daemon is ``python -m daemons ROLE`` in
its own workdir (as on its own host), optionally behind a command prefix such as
``ip netns exec NS`` (the namespace test). The measured failover time is what a user sees:
from SIGKILL of the leader to the first put that succeeds again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from transfer.etcd.leader import MasterView


@dataclass
class Process:
    name: str
    workdir: Path
    popen: subprocess.Popen

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)


@dataclass
class Cluster:
    """The daemons of a scenario; :meth:`close` kills every one of them."""

    root: Path
    settings: dict[str, Any]
    processes: list[Process] = field(default_factory=list)

    def spawn(self, role: str, name: str, prefix: list[str] | None = None, **overrides: Any) -> Process:
        workdir = self.root / name
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "settings.yaml").write_text(yaml.safe_dump({**self.settings, **overrides, "workdir": str(workdir)}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
        with open(workdir / f"{name}.log", "ab") as log:
            popen = subprocess.Popen([*(prefix or []), sys.executable, "-m", "daemons", role, "--name", name,
                                      "--workdir", str(workdir), "--cluster-id", f"ha{os.getpid()}"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     cwd=str(Path(__file__).resolve().parents[1]))
        process = Process(name, workdir, popen)
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in self.processes:
            process.kill()


def wait_until(predicate, timeout: float, what: str, step: float = 0.05) -> float:
    """Seconds until ``predicate()`` held; TimeoutError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} not within {timeout:.0f}s")
        time.sleep(step)
    return time.monotonic() - start


def wait_leader(view: MasterView, timeout: float, not_address: str | None = None) -> str:
    wait_until(lambda: view.leader() not in (None, not_address), timeout, "a master leading")
    return view.leader()


def payload(key: str, size: int) -> bytes:
    """Bytes derived from the key, so a reader can tell wrong bytes from right ones."""
    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def put_until_ok(client, key: str, data: bytes, timeout: float) -> float:
    """Retry one put until it succeeds (the leader may be changing); seconds it took."""
    from transfer.errors import MooncakeError

    def attempt() -> bool:
        try:
            client.put(key, data)
            return True
        except MooncakeError:
            return False
    return wait_until(attempt, timeout, f"a successful put of {key!r}", step=0.02)


def scenario_settings(etcd_endpoints: str, cluster_id: str, ttl: float, host: str = "127.0.0.1") -> dict[str, Any]:
    """Short timers so the scenario runs in seconds; the defaults are Mooncake's (5 s lease, 10 s TTL)."""
    return {"ha_backend": "etcd", "etcd_endpoints": etcd_endpoints, "cluster_id": cluster_id,
            "ha_lease_ttl": f"{ttl}s", "client_ttl": f"{2 * ttl}s", "ping_interval": "200ms",
            "rpc_timeout": "1s", "segment_size": "64MiB", "bind_host": host,
            "master": f"etcd://{etcd_endpoints}/{cluster_id}", "prefill_workers": 0, "decode_workers": 0}


def run_failover(root: Path, etcd_endpoints: str, num_objects: int, object_size: int, ttl: float,
                 **overrides: Any) -> dict[str, Any]:
    """Masters A (leader) and B, store client C; put objects; SIGKILL A; time the first good put.
    ``overrides``: settings that differ from :func:`scenario_settings`."""
    from store.client import StoreClient
    from transfer.settings import resolve

    cluster_id = f"bench{os.getpid()}"
    settings = {**scenario_settings(etcd_endpoints, cluster_id, ttl), **overrides}
    cluster = Cluster(root, settings)
    view = MasterView(settings["master"])
    try:
        a = cluster.spawn("master", "master-a")
        leader_a = wait_leader(view, 20, None)
        cluster.spawn("master", "master-b")
        cluster.spawn("store-client", "store-client-c")
        config = resolve({**settings, "workdir": str(root)}, environ={})
        with StoreClient(settings["master"], config) as client:
            keys = [f"obj-{i}" for i in range(num_objects)]
            for key in keys:
                put_until_ok(client, key, payload(key, object_size), 20)
            # At once: every acknowledged PutEnd is in etcd's op log, whatever C has heard of yet.
            a.kill()
            killed = time.monotonic()
            put_until_ok(client, "after-failover", payload("after-failover", object_size), 30)
            failover_s = time.monotonic() - killed
            leader_b = view.leader()
            readable_s = wait_until(lambda: all(client.master.batch_exists(keys)), 30, "every object back")
            wrong = sum(bytes(client.get(key)) != payload(key, object_size) for key in keys)
        return {"num_objects": num_objects, "object_size": object_size, "lease_ttl_s": ttl,
                "leader_before": leader_a, "leader_after": leader_b, "failover_s": failover_s,
                "all_readable_s": readable_s, "wrong_bytes": wrong}
    finally:
        cluster.close()
