"""`mooncake bench serve --hosts N`: the live Figure 5, a serving cluster spread over N+1 "hosts".

Each host is a network namespace with a veth pair onto one bridge (in a hub namespace), and its
own hostname (a UTS namespace per process, the same name for every process of one host): the
transfer engine tells "this host" from hostname + boot id, so without it every pair of processes
would use shared memory and never touch the links. Addresses are ``10.78.0.0/24``::

    head    10.78.0.1      master, conductor, decode worker, and the replay driver
    host-i  10.78.0.(1+i)  a store client (its pool segment) and a prefill worker, i = 1..N

With ``link_gbps`` every link is shaped with ``tc`` tbf in both directions (the host's egress and
the hub port's egress towards it), as a NIC of that rate would be.

For each policy the cluster starts cold (new processes, an empty store; the workers one at a
time, so that each one's start-up profile runs alone), the driver
(``python -m daemons.serving.bench_hosts`` in the head namespace, JSON on stdin and stdout)
waits for every worker, sends :data:`WARMUP_PER_HOST` untimed requests per prefill host at once
(:func:`warmup_requests`: prefix reuse off, so they store nothing and hit nothing; each worker's
first request otherwise pays 200-350 ms of connections and first-call set-up that no policy causes
and the simulator does not have), reads `/metrics` (the costs the conductor has from the profiles
and the warm-up), replays the same scaled slice (:mod:`daemons.serving.bench`) with prefix reuse, reads `/metrics`
again (the costs refitted from what was served), and the cluster is stopped again.
:class:`Hosts` removes its namespaces and every process in them however the run ends
(exception, SIGINT or SIGTERM).

The hosts are namespaces of this one machine, so they compute on its cores together: the
simulator's prediction beside each policy prices that (every instance on the cores this process
may use, :func:`transfer.rpc.spin.usable_cores`, processor sharing), and also gives the paper's
cluster, one compute per instance. Each policy's prediction is priced with that policy's own
run: its conductor's refitted costs are what things cost, and the simulated conductor starts
from the same profiled costs the live one started from
(:func:`daemons.serving.figure5.simulate_policy`); a third prices every policy alike, at the
runs' costs averaged.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from daemons.cluster.workdir import read_json
from daemons.errors import BenchHostsFailed
from daemons.ha.failover_scenario import Cluster, wait_until
from daemons.serving.bench import BOS, Replayed, replay
from daemons.serving.errors import Rejected
from daemons.serving.figure5 import (average_costs, cost_figures, parse_metrics, policy_summary, reuse_ceiling,
                                    simulate_policy, sim_requests)
from scheduler.config import SchedulerConfig
from scheduler.sim.trace import TraceRequest
from transfer.rpc.spin import usable_cores
from transfer.settings import resolve
from transfer.shm.region import remove_orphans

SUBNET = "10.78.0"
# Untimed warm-up requests per prefill host, sent together: a shortest-queue choice spreads them,
# so that every worker (and random's, most likely) serves at least one before the replay.
WARMUP_PER_HOST = 2
HEAD = "head"
REPO = Path(__file__).resolve().parents[2]


def missing_prerequisites() -> str | None:
    """One line saying why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "bench serve --hosts needs root (it creates network namespaces); run it as root or without --hosts"
    for program, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(program) is None:
            return f"bench serve --hosts needs `{program}` ({package}), which is not installed"
    return None


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise BenchHostsFailed(f"{' '.join(command)}: {result.stderr.strip()}")


class Hosts:
    """Namespaces ``<tag>-hub``, ``<tag>-head`` and ``<tag>-host1..N`` on one bridge; a context
    manager that removes them, and kills every process left in them, on exit."""

    def __init__(self, num_hosts: int, link_gbps: float | None = None) -> None:
        self.tag = f"mcb{os.getpid() % 100000}"
        self.names = [HEAD, *(f"host{i}" for i in range(1, num_hosts + 1))]
        self.link_gbps = link_gbps
        self.created: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.names.index(host) + 1}"

    def prefix(self, host: str) -> list[str]:
        """What runs a command on ``host``: in its namespace, under its hostname."""
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', f"{self.tag}-{host}"]

    def __enter__(self) -> Hosts:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        hub = self.namespace("hub")
        self._add(hub)
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for i, host in enumerate(self.names):
            ns, port = self.namespace(host), f"p{i}"
            self._add(ns)
            _run("ip", "-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", hub, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.link_gbps:
                for where, dev in ((ns, "eth0"), (hub, port)):
                    _run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                         "rate", f"{self.link_gbps * 1000:g}mbit", "burst", "256kb", "latency", "50ms")

    def _add(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self.created.append(ns)

    def close(self) -> None:
        for ns in reversed(self.created):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created.clear()

    def remaining(self) -> list[str]:
        """Namespaces of this run that still exist (none after :meth:`close`)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        return [name for name in listed if name.startswith(f"{self.tag}-")]


def cluster_settings(policy: str, block_tokens: int, request_timeout: float) -> dict[str, Any]:
    """Settings every daemon of one policy's cluster shares: the tiny model, small blocks and
    memory so N+1 torch processes fit the machine, generous timeouts for a loaded one.

    No SLOs: Figure 5 compares where the policies run requests, so every request is served and
    counts in the TTFT (only a full decode KV cache still rejects). With SLOs the policies' rows
    would average different subsets, and one pessimistic start-up profile of the single decode
    worker could reject every request, so that no decode sample ever corrects it."""
    return {"schedule_policy": policy, "kv_block_tokens": block_tokens, "kv_cache_size": "64MiB",
            "segment_size": "64MiB", "prefill_segment_size": "64MiB", "ttft_slo": 0, "tbt_slo": 0,
            "worker_timeout": "5s", "request_timeout": f"{request_timeout}s", "rpc_timeout": "5s",
            "prefill_workers": 0, "decode_workers": 0, "store_clients": 0}


def start_cluster(hosts: Hosts, root: Path, settings: dict[str, Any], timeout: float) -> tuple[Cluster, str]:
    """The daemons of one cluster across ``hosts``; returns it and the conductor's HTTP address."""
    cluster = Cluster(root, settings)
    try:
        head = hosts.address(HEAD)
        cluster.spawn("master", "master", hosts.prefix(HEAD), bind_host=head)
        master = _announced(cluster, "master", "address", timeout)
        cluster.settings["master"] = master
        cluster.spawn("conductor", "conductor", hosts.prefix(HEAD), bind_host=head)
        for host in hosts.names[1:]:
            cluster.spawn("store-client", f"store-{host}", hosts.prefix(host), bind_host=hosts.address(host))
        # Workers look the conductor up at the master as they start: only once it registered.
        http = _announced(cluster, "conductor", "http_address", timeout)
        # One worker at a time, in host order: each profiles its costs at start (a short prefill
        # or decode run the conductor plans with), and profiles that overlap on this machine's
        # few cores time each other's work and come out slow. A worker announces itself only
        # after its profile and its first heartbeat.
        workers = [("prefill", f"prefill-{host}", host) for host in hosts.names[1:]] + [("decode", "decode", HEAD)]
        for role, name, host in workers:
            cluster.spawn(role, name, hosts.prefix(host), bind_host=hosts.address(host))
            _announced(cluster, name, "address", timeout)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster, http


def _announced(cluster: Cluster, name: str, field: str, timeout: float) -> str:
    path = cluster.root / name / "run" / f"{name}.json"
    process = next(p for p in cluster.processes if p.name == name)

    def ready() -> bool:
        if process.popen.poll() is not None:
            raise BenchHostsFailed(f"{name} exited at start: see {cluster.root / name / f'{name}.log'}")
        return field in (read_json(path) or {})
    try:
        wait_until(ready, timeout, f"{name} announcing {field}", step=0.1)
    except TimeoutError as exc:
        raise BenchHostsFailed(str(exc)) from None
    return read_json(path)[field]


def stop_cluster(cluster: Cluster, grace: float = 5.0) -> None:
    """SIGTERM every daemon (they release their segments and shared memory), SIGKILL stragglers."""
    for process in cluster.processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in cluster.processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    cluster.close()  # SIGKILL whatever is left, and reap
    remove_orphans()  # shared memory of a daemon that had to be killed


def drive(hosts: Hosts, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run the replay driver in the head namespace (the only place the conductor is reachable
    from) and return its JSON answer."""
    command = [*hosts.prefix(HEAD), sys.executable, "-m", "daemons.serving.bench_hosts"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        result = subprocess.run(command, input=json.dumps(spec), capture_output=True, text=True, timeout=timeout,
                                cwd=str(REPO), env=env)
    except subprocess.TimeoutExpired:
        raise BenchHostsFailed(f"the replay driver did not finish within {timeout:.0f}s") from None
    if result.returncode:
        raise BenchHostsFailed(f"the replay driver failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout)


def run_figure5(num_hosts: int, policies: list[str], slice_: list[TraceRequest],
                requests: list[tuple[float, list[int], int]], *, max_blocks: int, block_tokens: int,
                link_gbps: float | None, request_timeout: float, start_timeout: float) -> dict[str, Any]:
    """Replay ``requests`` (``slice_`` scaled) once per policy on a cold cluster over ``num_hosts``
    prefill hosts, then the simulator over the same slice priced with that policy's run: each
    row says the costs its conductor had from the workers' start-up profiles (``costs_profiled``)
    and at the end, refitted from its live samples (``costs_refitted``); the simulator prices the
    run with the latter and plans from the former (:func:`simulate_policy`): ``sim`` with every
    instance on this machine's cores (``sim_cores`` of them), ``sim_dedicated`` with one compute
    per instance; ``sim_averaged`` on this machine's cores with every policy priced alike, at the
    runs' ``averaged_costs`` (:func:`average_costs`).
    Namespaces and processes are gone when this returns or raises; the
    daemons' logs stay in a temporary directory only when a daemon or the driver failed
    (BenchHostsFailed names where)."""
    rows: dict[str, dict[str, Any]] = {}
    root = Path(tempfile.mkdtemp(prefix="mooncake-bench-hosts-"))
    keep_logs = False
    horizon = requests[-1][0] if requests else 0.0
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with Hosts(num_hosts, link_gbps) as hosts:
            for policy in policies:
                settings = cluster_settings(policy, block_tokens, request_timeout)
                cluster, url = start_cluster(hosts, root / policy, settings, start_timeout)
                try:
                    answer = drive(hosts, {"url": url, "workers": {"prefill": num_hosts, "decode": 1},
                                           "start_timeout": start_timeout, "request_timeout": request_timeout,
                                           "warmup": warmup_requests(WARMUP_PER_HOST * num_hosts, block_tokens),
                                           "requests": requests},
                                   timeout=start_timeout + horizon + 2 * request_timeout)
                finally:
                    stop_cluster(cluster)
                metrics = parse_metrics(answer["metrics"])
                rows[policy] = policy_summary(answer["outcomes"], metrics, answer["seconds"])
                rows[policy]["warmup"] = answer["warmup"]
                # Every host shares this machine's cores: what else ran is part of the result.
                rows[policy]["load_average"] = os.getloadavg()[0]
                rows[policy]["costs_profiled"] = cost_figures(parse_metrics(answer["metrics_before"]))
                rows[policy]["costs_refitted"] = cost_figures(metrics)
        left = hosts.remaining()
    except BenchHostsFailed:
        keep_logs = True  # the error names a daemon's log in there
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep_logs:
            shutil.rmtree(root, ignore_errors=True)
    sim_slice = sim_requests(slice_, [tokens for _, tokens, _ in requests], max_blocks,
                             [out for _, _, out in requests])
    cores = usable_cores()
    averaged = add_predictions(rows, sim_slice, num_hosts, block_tokens, request_timeout, cores)
    return {"sim_cores": cores, "averaged_costs": averaged, "reuse_ceiling": reuse_ceiling(sim_slice),
            "policies": rows, "namespaces_left": left}


def add_predictions(rows: dict[str, dict[str, Any]], sim_slice: list[TraceRequest], num_hosts: int,
                    block_tokens: int, request_timeout: float, cores: int) -> dict[str, Any] | None:
    """Add the simulator's predictions to each policy's row (``sim``, ``sim_dedicated``,
    ``sim_averaged``: see :func:`run_figure5`); returns the runs' averaged costs (None when no
    conductor showed its costs)."""
    priced = [policy for policy, row in rows.items() if row["costs_refitted"] and row["costs_profiled"]]
    if not priced:
        return None  # conductors without cost gauges: nothing to price the simulator with
    averaged = average_costs([rows[policy]["costs_refitted"] for policy in priced])
    averaged_profile = average_costs([rows[policy]["costs_profiled"] for policy in priced])
    for policy in priced:
        row = rows[policy]
        config = resolve(cluster_settings(policy, block_tokens, request_timeout), environ={})
        cfg = SchedulerConfig.from_config(config)
        for name, costs, profiled, shared in (
                ("sim", row["costs_refitted"], row["costs_profiled"], cores),
                ("sim_dedicated", row["costs_refitted"], row["costs_profiled"], None),
                ("sim_averaged", averaged, averaged_profile, cores)):
            row[name] = simulate_policy(sim_slice, cfg, num_hosts, costs,
                                        config.prefill_segment_size // costs["kv_bytes_per_token"],
                                        config.kv_cache_size // costs["kv_bytes_per_token"],
                                        shared_cores=shared, planned_with=profiled)
    return averaged


def warmup_requests(num: int, block_tokens: int) -> list[tuple[float, list[int], int]]:
    """``num`` requests of two blocks of their own and two output tokens, all at time 0; sent
    with prefix reuse off, they leave nothing in the store or the index for the replay to find."""
    rng = random.Random("warmup")
    return [(0.0, [BOS, *(rng.randrange(256) for _ in range(2 * block_tokens))], 2) for _ in range(num)]


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: namespaces and daemons go


def _get(url: str, path: str) -> tuple[int, bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _workers(url: str) -> dict | None:
    try:
        return json.loads(_get(url, "/health")[1])["workers"]
    except (OSError, ValueError, KeyError):
        return None  # not serving yet


def _outcome(replayed: Replayed) -> dict[str, Any]:
    completion = replayed.completion
    if completion is None:
        rejected = isinstance(replayed.error, Rejected)
        return {"ok": False, "rejected": rejected, "reason": replayed.error.reason if rejected else None,
                "error": str(replayed.error)}
    return {"ok": True, "ttft": completion.client_ttft, "gaps": completion.client_gaps,
            "prompt_tokens": replayed.prompt_tokens, "mooncake": completion.mooncake}


def _driver_main() -> None:
    """In the head namespace: wait for every worker, send the untimed warm-up (prefix reuse off),
    read `/metrics`, replay with prefix reuse, read `/metrics` again. Reads ``{"url", "workers",
    "start_timeout", "request_timeout", "warmup", "requests"}`` on stdin and writes ``{"warmup":
    {"requests", "completed"}, "outcomes", "seconds", "metrics_before", "metrics"}`` on stdout."""
    spec = json.load(sys.stdin)
    url = spec["url"]
    wait_until(lambda: _workers(url) == spec["workers"], spec["start_timeout"], "every worker joining", step=0.2)
    warm = replay(url, [tuple(r) for r in spec["warmup"]], False, spec["request_timeout"])
    warmup = {"requests": len(warm.results), "completed": sum(r.completion is not None for r in warm.results)}
    before = _metrics(url)
    report = replay(url, [tuple(r) for r in spec["requests"]], True, spec["request_timeout"])
    json.dump({"warmup": warmup, "outcomes": [_outcome(r) for r in report.results], "seconds": report.seconds,
               "metrics_before": before, "metrics": _metrics(url)}, sys.stdout)


def _metrics(url: str) -> str:
    status, text = _get(url, "/metrics")
    return text.decode() if status == 200 else ""


if __name__ == "__main__":
    _driver_main()
