"""Start, inspect and stop the daemons of a single-host cluster (`mooncake up/status/down`).

`up` starts the daemons of :func:`daemons.roles.cluster_plan` wave by wave through the launcher
(:mod:`daemons.launcher`: its own session, its pidfile, waiting until it answers ``health``): a
wave's daemons start together, and the next wave only once all of them answer. If one fails
within ``start_timeout`` it reports which and the tail of its log, and stops every daemon it
started. `down` sends SIGTERM, waits ``stop_grace``, then SIGKILL, and removes the pidfiles,
records and shared memory of the cluster.
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

import psutil
import yaml

import topology
from daemons.cluster.directory import cluster_info
from daemons.cluster.workdir import ClusterPaths, read_json, shm_prefix
from daemons.errors import ClusterAlreadyRunning, ClusterNotRunning, WorkdirUnusable
from daemons.launcher import (daemon_environment, forget_announcement, live_daemons, new_cluster_id,
                              process_if_alive, reap, replace_cluster_row, spawn, wait_healthy,
                              write_cluster_record, write_pidfile)
from daemons.roles import DaemonSpec, cluster_plan
from transfer.auth import ClusterSecret, cluster_secret, create_secret_file, keep_secret_file
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import Config

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
    metrics_url: str | None = None  # its Prometheus endpoint; None: metrics_port 0, or not up
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
        paths.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in (paths.run_dir, paths.log_dir):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The run directory holds the daemons' sockets: other users need not even reach them.
        paths.run_dir.chmod(0o700)
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
    keep_secret_file(config)
    if cluster_secret(config) is None:
        # Every cluster `up` starts is authenticated: without a secret given, one of its own,
        # which every daemon, CLI command and library client of this workdir reads.
        create_secret_file(paths.workdir)
    # Discovered once here (or loaded from --topology and checked), read by every daemon that
    # owns a transfer engine, so they all pick paths from the same matrix.
    matrix, _ = topology.load_or_discover(config.topology, config.sysfs_root, config.include_virtual)
    topology.write_matrix(matrix, paths.topology_file)
    cluster_id = new_cluster_id()
    started: list[DaemonSpec] = []
    announced: list[dict[str, Any]] = []
    try:
        for wave in cluster_plan(config):
            launched = []
            for spec in wave:
                started.append(spec)
                launched.append(_launch(paths, spec, cluster_id, 0, config))
            deadline = time.monotonic() + config.start_timeout
            announced += [_wait_answer(paths, spec.name, process, deadline, config)
                          for spec, process in zip(wave, launched)]
    except MooncakeError:
        _stop(paths, [s.name for s in started], config.stop_grace)
        _remove_shared_memory(cluster_id)
        _clear_records(paths)
        raise
    return write_cluster_record(paths, cluster_id, time.time(), [
        {**announce, "log": str(paths.log_file(spec.name))} for spec, announce in zip(started, announced)])


def restart(paths: ClusterPaths, name: str, config: Config) -> dict[str, Any]:
    """Start one daemon of the running cluster again (after it died) on its old control port, so
    the other daemons' sockets find it again by themselves. Returns its new announce record."""
    cluster = cluster_info(paths)
    record = read_json(paths.pidfile(name))
    if record is None:
        raise ClusterNotRunning(f"the cluster in {paths.workdir} has no daemon {name!r}")
    if process_if_alive(record) is not None:
        raise ClusterAlreadyRunning(f"daemon {name!r} is still running (pid {record['pid']})")
    old = read_json(paths.announce_file(name)) or {}
    port = int(old["address"].rsplit(":", 1)[1]) if old.get("address") else 0
    forget_announcement(paths, name)
    process = _launch(paths, DaemonSpec(name, record["role"]), cluster["cluster_id"], port, config)
    return _wait_answer(paths, name, process, time.monotonic() + config.start_timeout, config)


def restart_daemon(paths: ClusterPaths, which: str, config: Config) -> dict[str, Any]:
    """`mooncake restart`: stop the daemon named ``which`` (or the only one of that role) if it
    runs, start it again on its old port in the same cluster, and put its new record in
    cluster.json in place of the old one. The other daemons keep running and reconnect."""
    names = paths.known_daemons()
    if which not in names:
        of_role = [n for n in names if (read_json(paths.pidfile(n)) or {}).get("role") == which]
        if len(of_role) != 1:
            choices = ", ".join(names) or "none"
            raise ClusterNotRunning(f"no daemon named {which!r}" + (" (several have that role: name one)"
                                    if of_role else "") + f" in {paths.workdir}; daemons: {choices}")
        which = of_role[0]
    _stop_group(paths, [which], config.stop_grace)
    announce = restart(paths, which, config)
    replace_cluster_row(paths, {**announce, "log": str(paths.log_file(which))})
    return announce


def _launch(paths: ClusterPaths, spec: DaemonSpec, cluster_id: str, port: int, config: Config) -> subprocess.Popen:
    """Start one daemon as ``python -m daemons ROLE`` and record its pid."""
    process = spawn(paths, spec.name, [sys.executable, "-m", "daemons", spec.role, "--name", spec.name,
                                       "--workdir", str(paths.workdir), "--cluster-id", cluster_id,
                                       "--port", str(port)], daemon_environment(config))
    write_pidfile(paths, spec.name, spec.role, cluster_id, process.pid)
    return process


def _wait_answer(paths: ClusterPaths, name: str, process: subprocess.Popen, deadline: float,
                 config: Config) -> dict[str, Any]:
    """The launched daemon's announce record once it answers."""
    return wait_healthy(paths, name, process, deadline, config.rpc_timeout, cluster_secret(config))


def _health(address: str, timeout: float, secret: ClusterSecret | None) -> dict | None:
    with RpcClient(address, timeout=timeout, secret=secret) as client:
        try:
            return client.call("status")
        except MooncakeError:
            return None


def status(paths: ClusterPaths, rpc_timeout: float = 1.0, secret: ClusterSecret | None = None) -> list[DaemonState]:
    states = []
    for name in paths.known_daemons():
        record = read_json(paths.pidfile(name)) or {}
        announce = read_json(paths.announce_file(name)) or {}
        process = process_if_alive(record)
        answer = _health(announce["address"], rpc_timeout, secret) if process and announce else None
        exit_reason = None
        if process is None:
            exit_reason = (read_json(paths.exit_file(name)) or {}).get(
                "reason", "died without a word (killed by a signal, or crashed): see its log")
        states.append(DaemonState(
            name=name, role=record.get("role", "?"), pid=record.get("pid"),
            address=announce.get("address"), alive=process is not None, healthy=answer is not None,
            uptime_s=answer["uptime_s"] if answer else None, exit_reason=exit_reason,
            log=str(paths.log_file(name)), metrics_url=announce.get("metrics_url"), details=answer or {},
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
    """Stop the named daemons in reverse start order, masters last (a master restarted after
    the others started is still stopped after them): a store client unmounts from a master
    that is still there, instead of waiting out its deadline against one that is gone and
    being killed."""
    outcome: dict[str, list[str]] = {"stopped": [], "killed": []}
    roles = {name: (read_json(paths.pidfile(name)) or {}).get("role") for name in names}
    for name in sorted(reversed(names), key=lambda n: roles[n] == "master"):
        one = _stop_group(paths, [name], grace)
        outcome["stopped"] += one["stopped"]
        outcome["killed"] += one["killed"]
    return {key: sorted(value) for key, value in outcome.items()}


def _stop_group(paths: ClusterPaths, names: list[str], grace: float) -> dict[str, Any]:
    """SIGTERM the named daemons (and anything they spawned), SIGKILL what outlives the grace."""
    processes: dict[str, psutil.Process] = {}
    for name in names:
        process = process_if_alive(read_json(paths.pidfile(name)))
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
        reap(process.pid)
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
