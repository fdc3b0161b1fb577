"""Starting one background daemon, and the records that say it runs: the one launcher.

`mooncake up` (through :mod:`daemons.supervisor`) and `mooncake start ROLE` both start their
daemons here: :func:`spawn` runs the command in a new session (so a terminal's Ctrl-C does not
reach it) with its output in the daemon's log, and :func:`wait_healthy` returns the daemon's
announce record once it answers ``health``, or raises :class:`DaemonStartFailed` with the reason
and the tail of its log. This module also owns the records other commands read:

- the pidfile ``<workdir>/run/<name>.pid`` holds the pid *and* the process start time, so a pid
  reused by an unrelated process after a crash is never mistaken for a live daemon, and never
  signalled (:func:`process_if_alive`);
- ``<workdir>/cluster.json`` names the cluster (its id names the shared memory `down` removes)
  and where its daemons answer; :mod:`daemons.cluster.directory` reads it.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable

import psutil
import yaml

from daemons.base import Daemon
from daemons.cluster.workdir import ClusterPaths, read_json, write_json_atomic
from daemons.errors import DaemonStartFailed
from transfer.auth import ClusterSecret, cluster_secret
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import Config

LOG_TAIL_LINES = 20
REPO = Path(__file__).resolve().parent.parent


def new_cluster_id() -> str:
    return uuid.uuid4().hex[:8]


def write_pidfile(paths: ClusterPaths, name: str, role: str, cluster_id: str, pid: int) -> None:
    write_json_atomic(paths.pidfile(name), {"pid": pid, "role": role, "cluster_id": cluster_id,
                                            "create_time": psutil.Process(pid).create_time()})


def forget_announcement(paths: ClusterPaths, name: str) -> None:
    """Remove what an earlier run of the daemon said (its address, why it stopped), so nothing
    waits on or reports a predecessor."""
    for stale in (paths.announce_file(name), paths.exit_file(name)):
        stale.unlink(missing_ok=True)


def write_cluster_record(paths: ClusterPaths, cluster_id: str, started_at: float,
                         daemons: list[dict[str, Any]]) -> dict[str, Any]:
    cluster = {"cluster_id": cluster_id, "workdir": str(paths.workdir), "started_at": started_at,
               "daemons": daemons}
    write_json_atomic(paths.cluster_file, cluster)
    return cluster


def joined_cluster_id(paths: ClusterPaths) -> str:
    """One cluster id per workdir: the one already recorded there, else a new one recorded now."""
    cluster = read_json(paths.cluster_file)
    if cluster:
        return cluster["cluster_id"]
    cluster_id = new_cluster_id()
    write_cluster_record(paths, cluster_id, time.time(), [])
    return cluster_id


def process_if_alive(record: dict | None) -> psutil.Process | None:
    """The live process a pidfile record names, or None (dead, zombie, or pid reused)."""
    if not record or not isinstance(record.get("pid"), int):
        return None
    try:
        process = psutil.Process(record["pid"])
        if abs(process.create_time() - record.get("create_time", 0)) > 0.05:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            reap(process.pid)
            return None
        return process
    except psutil.Error:
        return None


def reap(pid: int) -> None:
    """Collect a child that died, when the caller is its parent (tests, a still-running `up`)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def live_daemons(paths: ClusterPaths) -> dict[str, psutil.Process]:
    live = {}
    for name in paths.known_daemons():
        process = process_if_alive(read_json(paths.pidfile(name)))
        if process is not None:
            live[name] = process
    return live


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def spawn(paths: ClusterPaths, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """Run ``command`` as daemon ``name`` in a new session, its stdout and stderr in its log."""
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.log_file(name), "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, cwd=str(REPO))


def daemon_environment(config: Config) -> dict[str, str]:
    """The environment of a daemon that reads ``config`` from a settings file: ours without the
    MOONCAKE_* variables, which the daemon would otherwise rank above the file (so `up
    --segment-size 64MiB` under MOONCAKE_SEGMENT_SIZE=8MiB made 8 MiB segments), but with the
    cluster secret, which no settings file holds: it is handed over the way it came."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    if config.cluster_secret:
        env["MOONCAKE_CLUSTER_SECRET"] = config.cluster_secret
    return env


def wait_healthy(paths: ClusterPaths, name: str, process: subprocess.Popen, deadline: float,
                 rpc_timeout: float, secret: ClusterSecret | None) -> dict[str, Any]:
    """The daemon's announce record once it answers ``health``. The record must carry the
    process's own pid: one a predecessor left behind names an address nobody serves."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            exit_record = read_json(paths.exit_file(name)) or {}
            raise DaemonStartFailed(name, exit_record.get("reason", f"exited with {process.returncode} during start-up"),
                                    log_tail(paths.log_file(name)))
        announce = read_json(paths.announce_file(name))
        if announce and announce.get("pid") == process.pid and _answers(announce["address"], min(rpc_timeout, 1.0), secret):
            return announce
        time.sleep(0.05)
    raise DaemonStartFailed(name, "did not answer a health check before the start timeout",
                            log_tail(paths.log_file(name)))


def _answers(address: str, timeout: float, secret: ClusterSecret | None) -> bool:
    with RpcClient(address, timeout=timeout, secret=secret) as client:
        try:
            client.call("health")
            return True
        except MooncakeError:
            return False


def start_in_background(paths: ClusterPaths, config: Config, name: str, command: list[str]) -> dict[str, Any]:
    """Run ``command ... --workdir W --config SETTINGS`` (a `start ROLE --foreground`) as daemon
    ``name``; return its announce record once it answers. The child reads the settings we
    resolved from a file, with the MOONCAKE_* variables taken out of its environment, so it
    resolves exactly our values. A daemon that does not come up is stopped before the error
    is raised."""
    paths.workdir.mkdir(parents=True, exist_ok=True)
    settings = paths.daemon_settings_file(name)
    settings.write_text(yaml.safe_dump(config.as_plain(), sort_keys=True))
    process = spawn(paths, name, [*command, "--workdir", str(paths.workdir), "--config", str(settings)],
                    daemon_environment(config))
    try:
        return wait_healthy(paths, name, process, time.monotonic() + config.start_timeout, config.rpc_timeout,
                            cluster_secret(config))
    except DaemonStartFailed:
        process.terminate()
        raise


def run_in_foreground(paths: ClusterPaths, role: str, name: str, make: Callable[[str], Daemon], *,
                      founds_cluster: bool = False, entry: dict[str, Any] | None = None) -> int:
    """Run the daemon ``make(cluster_id)`` builds in this process until it stops, with the
    records `up` writes for its daemons, so `mooncake status` and `mooncake down` see it.

    A daemon that ``founds_cluster`` (a master started on its own) gives the workdir a new
    cluster id and a cluster.json naming it (with ``entry``'s fields in its row), unless other
    daemons of the workdir still run: then it is a restart, and it takes its row in the cluster
    they belong to, keeping its id and their rows. Any other daemon joins the id recorded there."""
    for directory in (paths.run_dir, paths.log_dir):
        directory.mkdir(parents=True, exist_ok=True)
    others_run = any(other != name for other in live_daemons(paths))
    founding = founds_cluster and not (others_run and read_json(paths.cluster_file))
    cluster_id = new_cluster_id() if founding else joined_cluster_id(paths)
    write_pidfile(paths, name, role, cluster_id, os.getpid())
    forget_announcement(paths, name)
    daemon = make(cluster_id)
    if founds_cluster:
        row = {"name": name, "role": role, "pid": os.getpid(), "address": daemon.server.address,
               "log": str(paths.log_file(name)), **(entry or {})}
        if founding:
            write_cluster_record(paths, cluster_id, daemon.started_at, [row])
        else:
            replace_cluster_row(paths, row)
    return daemon.run()


def replace_cluster_row(paths: ClusterPaths, row: dict[str, Any]) -> None:
    """Put ``row`` in place of the daemon of the same name in cluster.json (or add it)."""
    cluster = read_json(paths.cluster_file) or {}
    rows = [r for r in cluster.get("daemons", []) if r.get("name") != row["name"]]
    position = next((i for i, r in enumerate(cluster.get("daemons", [])) if r.get("name") == row["name"]), len(rows))
    rows.insert(position, row)
    write_json_atomic(paths.cluster_file, {**cluster, "daemons": rows})
