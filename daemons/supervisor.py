"""Start, inspect and stop the daemons of a single-host cluster (`mooncake up/status/down`).

`up` spawns each daemon of :func:`daemons.roles.cluster_plan` in order as its own session
(so a terminal's Ctrl-C does not reach it), waits until it answers ``health``, and only then
starts the next. If one fails within ``start_timeout`` it reports which and the tail of its
log, and stops every daemon it started. `down` sends SIGTERM, waits ``stop_grace``, then
SIGKILL, and removes the pidfiles, records and shared memory of the cluster.

A pidfile holds the pid *and* the process start time: a pid reused by an unrelated process
after a crash is never mistaken for a live daemon, and never signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

import topology
from daemons.errors import ClusterAlreadyRunning, ClusterNotRunning, DaemonStartFailed, WorkdirUnusable
from daemons.cluster.workdir import ClusterPaths, read_json, shm_prefix, write_json_atomic
from daemons.roles import DaemonSpec, cluster_plan
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import Config

LOG_TAIL_LINES = 20
SHM_DIR = Path("/dev/shm")


@dataclass
class DaemonState:
    name: str
    role: str
    pid: int | None
    address: str | None
    alive: bool
    healthy: bool
    uptime_s: float | None
    exit_reason: str | None
    log: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _process_if_alive(record: dict | None) -> psutil.Process | None:
    """The live process a pidfile record names, or None (dead, zombie, or pid reused)."""
    if not record or not isinstance(record.get("pid"), int):
        return None
    try:
        process = psutil.Process(record["pid"])
        if abs(process.create_time() - record.get("create_time", 0)) > 0.05:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            _reap(process.pid)
            return None
        return process
    except psutil.Error:
        return None


def _reap(pid: int) -> None:
    """Collect a child that died, when the caller is its parent (tests, a still-running `up`)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def live_daemons(paths: ClusterPaths) -> dict[str, psutil.Process]:
    live = {}
    for name in paths.known_daemons():
        process = _process_if_alive(read_json(paths.pidfile(name)))
        if process is not None:
            live[name] = process
    return live


def _clear_records(paths: ClusterPaths) -> None:
    for name in paths.known_daemons():
        # The Unix socket too: a daemon that stops cleanly unlinks it, a killed one cannot.
        for path in (paths.pidfile(name), paths.announce_file(name), paths.exit_file(name),
                     paths.ipc_socket(name)):
            path.unlink(missing_ok=True)
    paths.cluster_file.unlink(missing_ok=True)


def _remove_shared_memory(cluster_id: str | None) -> list[str]:
    if not cluster_id or not SHM_DIR.is_dir():
        return []
    removed = []
    for region in SHM_DIR.glob(shm_prefix(cluster_id) + "*"):
        region.unlink(missing_ok=True)
        removed.append(region.name)
    return removed


def _prepare_workdir(paths: ClusterPaths) -> None:
    """Create the workdir's folders, or say plainly why they cannot be (a file in the way, no
    permission), before anything else touches them."""
    try:
        for directory in (paths.run_dir, paths.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        probe = paths.run_dir / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise WorkdirUnusable(f"cannot use {paths.workdir} as the cluster's workdir: "
                              f"{exc.strerror or exc} ({exc.filename or paths.workdir})") from None


def up(config: Config) -> dict[str, Any]:
    """Start the cluster in ``config.workdir``; returns what cluster.json records."""
    paths = ClusterPaths.of(config.workdir)
    _prepare_workdir(paths)
    live = live_daemons(paths)
    if live:
        raise ClusterAlreadyRunning(
            f"a cluster is already running in {paths.workdir} "
            f"({', '.join(f'{n} pid {p.pid}' for n, p in live.items())}); run `mooncake down` first")
    stale = read_json(paths.cluster_file) or {}
    _remove_shared_memory(stale.get("cluster_id"))
    _clear_records(paths)
    paths.settings_file.write_text(yaml.safe_dump(config.as_plain(), sort_keys=True))
    # Discovered once here (or loaded from --topology and checked), read by every daemon that
    # owns a transfer engine, so they all pick paths from the same matrix.
    matrix, _ = topology.load_or_discover(config.topology, config.sysfs_root, config.include_virtual)
    topology.write_matrix(matrix, paths.topology_file)
    cluster_id = uuid.uuid4().hex[:8]
    started: list[DaemonSpec] = []
    try:
        for spec in cluster_plan(config):
            _spawn(paths, spec, cluster_id)
            started.append(spec)
            _wait_healthy(paths, spec, time.monotonic() + config.start_timeout, config.rpc_timeout)
    except MooncakeError:
        _stop(paths, [s.name for s in started], config.stop_grace)
        _remove_shared_memory(cluster_id)
        _clear_records(paths)
        raise
    cluster = {
        "cluster_id": cluster_id,
        "workdir": str(paths.workdir),
        "started_at": time.time(),
        "daemons": [
            {**(read_json(paths.announce_file(s.name)) or {}), "log": str(paths.log_file(s.name))}
            for s in started
        ],
    }
    write_json_atomic(paths.cluster_file, cluster)
    return cluster


def restart(paths: ClusterPaths, name: str, config: Config) -> dict[str, Any]:
    """Start one daemon of the running cluster again (after it died) on its old control port, so
    the other daemons' sockets find it again by themselves. Returns its new announce record."""
    cluster = cluster_info(paths)
    record = read_json(paths.pidfile(name))
    if record is None:
        raise ClusterNotRunning(f"the cluster in {paths.workdir} has no daemon {name!r}")
    if _process_if_alive(record) is not None:
        raise ClusterAlreadyRunning(f"daemon {name!r} is still running (pid {record['pid']})")
    old = read_json(paths.announce_file(name)) or {}
    port = int(old["address"].rsplit(":", 1)[1]) if old.get("address") else 0
    for stale in (paths.announce_file(name), paths.exit_file(name)):
        stale.unlink(missing_ok=True)
    spec = DaemonSpec(name, record["role"])
    _spawn(paths, spec, cluster["cluster_id"], port)
    _wait_healthy(paths, spec, time.monotonic() + config.start_timeout, config.rpc_timeout)
    return read_json(paths.announce_file(name)) or {}


def _spawn(paths: ClusterPaths, spec: DaemonSpec, cluster_id: str, port: int = 0) -> None:
    command = [sys.executable, "-m", "daemons", spec.role, "--name", spec.name,
               "--workdir", str(paths.workdir), "--cluster-id", cluster_id, "--port", str(port)]
    with open(paths.log_file(spec.name), "ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent),
        )
    write_json_atomic(paths.pidfile(spec.name), {
        "pid": process.pid, "role": spec.role, "cluster_id": cluster_id,
        "create_time": psutil.Process(process.pid).create_time(),
    })


def _wait_healthy(paths: ClusterPaths, spec: DaemonSpec, deadline: float, rpc_timeout: float) -> None:
    record = read_json(paths.pidfile(spec.name))
    while time.monotonic() < deadline:
        if _process_if_alive(record) is None:
            exit_record = read_json(paths.exit_file(spec.name)) or {}
            raise DaemonStartFailed(spec.name, exit_record.get("reason", "exited during start-up"),
                                    _log_tail(paths.log_file(spec.name)))
        announce = read_json(paths.announce_file(spec.name))
        if announce and _health(announce["address"], min(rpc_timeout, 1.0)):
            return
        time.sleep(0.05)
    raise DaemonStartFailed(spec.name, "did not answer a health check before the start timeout",
                            _log_tail(paths.log_file(spec.name)))


def _health(address: str, timeout: float) -> dict | None:
    with RpcClient(address, timeout=timeout) as client:
        try:
            return client.call("status")
        except MooncakeError:
            return None


def status(paths: ClusterPaths, rpc_timeout: float = 1.0) -> list[DaemonState]:
    states = []
    for name in paths.known_daemons():
        record = read_json(paths.pidfile(name)) or {}
        announce = read_json(paths.announce_file(name)) or {}
        process = _process_if_alive(record)
        answer = _health(announce["address"], rpc_timeout) if process and announce else None
        exit_reason = None
        if process is None:
            exit_reason = (read_json(paths.exit_file(name)) or {}).get(
                "reason", "died without a word (killed by a signal, or crashed): see its log")
        states.append(DaemonState(
            name=name, role=record.get("role", "?"), pid=record.get("pid"),
            address=announce.get("address"), alive=process is not None, healthy=answer is not None,
            uptime_s=answer["uptime_s"] if answer else None, exit_reason=exit_reason,
            log=str(paths.log_file(name)), details=answer or {},
        ))
    return states


def down(paths: ClusterPaths, grace: float) -> dict[str, Any]:
    """Stop every daemon of the cluster and remove what it owned. Returns what was done."""
    names = paths.known_daemons()
    if not names and not paths.cluster_file.exists():
        raise ClusterNotRunning(f"no cluster in {paths.workdir}")
    cluster_id = (read_json(paths.cluster_file) or {}).get("cluster_id") or next(
        (r.get("cluster_id") for r in (read_json(paths.pidfile(n)) for n in names) if r), None)
    outcome = _stop(paths, names, grace)
    outcome["shared_memory_removed"] = _remove_shared_memory(cluster_id)
    _clear_records(paths)
    return outcome


def _stop(paths: ClusterPaths, names: list[str], grace: float) -> dict[str, Any]:
    """Stop the named daemons in reverse start order: a store client unmounts from a master that
    is still there, instead of waiting out its deadline against one that is gone."""
    outcome: dict[str, list[str]] = {"stopped": [], "killed": []}
    for name in reversed(names):
        one = _stop_group(paths, [name], grace)
        outcome["stopped"] += one["stopped"]
        outcome["killed"] += one["killed"]
    return {key: sorted(value) for key, value in outcome.items()}


def _stop_group(paths: ClusterPaths, names: list[str], grace: float) -> dict[str, Any]:
    """SIGTERM the named daemons (and anything they spawned), SIGKILL what outlives the grace."""
    processes: dict[str, psutil.Process] = {}
    for name in names:
        process = _process_if_alive(read_json(paths.pidfile(name)))
        if process is None:
            continue
        processes[name] = process
        try:
            children = process.children(recursive=True)
        except psutil.Error:
            children = []
        for index, child in enumerate(children):
            processes[f"{name}/child{index}"] = child
    for process in processes.values():
        _signal(process, signal.SIGTERM)
    alive = _wait_exited(list(processes.values()), grace)
    for process in alive:
        _signal(process, signal.SIGKILL)
    _wait_exited(alive, 5)
    for process in processes.values():
        _reap(process.pid)
    return {"stopped": sorted(processes), "killed": sorted(n for n, p in processes.items() if p in alive)}


def _wait_exited(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until each process has exited; returns those still running at the deadline.

    A zombie counts as exited: a daemon `up` started is an orphan whose zombie only its new
    parent (init) can reap, and some inits reap only every second or two, so waiting for the pid
    to vanish (psutil.wait_procs) made every daemon look 1-2 s slow to stop."""
    deadline = time.monotonic() + timeout
    alive = list(processes)
    while True:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except psutil.Error:
        pass


def cluster_info(paths: ClusterPaths) -> dict[str, Any]:
    """cluster.json, for commands that need daemon addresses."""
    info = read_json(paths.cluster_file)
    if info is None:
        raise ClusterNotRunning(f"no cluster in {paths.workdir}: start one with `mooncake up`")
    return info


def daemon_address(paths: ClusterPaths, role: str) -> str:
    return _daemon_record(paths, role)["address"]


def local_daemon_address(paths: ClusterPaths, role: str) -> str:
    """The daemon's unix:// endpoint when it has one on this host (a round trip over it costs
    a fraction of one through ZeroMQ over TCP loopback), else its TCP address."""
    daemon = _daemon_record(paths, role)
    if daemon.get("ipc_address") and daemon.get("hostname") == socket.gethostname():
        return daemon["ipc_address"]
    return daemon["address"]


def _daemon_record(paths: ClusterPaths, role: str) -> dict[str, Any]:
    for daemon in cluster_info(paths)["daemons"]:
        if daemon.get("role") == role:
            return daemon
    raise ClusterNotRunning(f"the cluster in {paths.workdir} has no {role}")
