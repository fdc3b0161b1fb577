"""`mooncake start ROLE` for the roles other than the master: store-client, conductor, prefill, decode.

One daemon per command, for a deployment across hosts (systemd units, containers): the daemon
runs the same class `mooncake up` starts, with the pidfile and announce records `up` writes, so
`mooncake status` and `mooncake down` on that host see it. Every role finds its master with
``--master ADDR`` or ``--master etcd://host:port[,host:port][/cluster]`` (following the elected
leader); without it, the master of the same workdir. With ``--master`` the conductor registers
its addresses with the master and the workers find it there (:mod:`daemons.cluster.service_registry`),
so no two roles need to share a workdir or a host. Before starting, the advertised address is
checked: a loopback address advertised to a master or etcd on another host is refused.

Without --foreground the command runs itself again with --foreground in a new session, waits
until the daemon answers, and prints its address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil
import typer
import yaml

from daemons.cluster.advertise import check_reachable
from daemons.cluster.workdir import ClusterPaths, read_json, write_json_atomic
from daemons.roles import DAEMON_CLASSES
from daemons.supervisor import live_daemons
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail, fail_on
from transfer.errors import MooncakeError
from transfer.rpc.client_server import RpcClient
from transfer.settings import SECTIONS

ROLES = ("store-client", "conductor", "prefill", "decode")


def register(app: typer.Typer) -> None:
    for role in ROLES:
        app.command(role, help=f"Start one {role} daemon (foreground or background).")(_command(role))


def _command(role: str) -> Callable:
    @settings_options(*SECTIONS)
    def command(
        foreground: bool = typer.Option(False, "--foreground", help="Run in this process until SIGTERM or Ctrl-C."),
        name: str = typer.Option(role, "--name", help="Daemon name (pidfile, log, client id)."),
        port: int = typer.Option(0, "--port", help="Control port (0: any free one).", min=0, max=65535),
        json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
        *,
        config: Config,
    ) -> None:
        paths = preflight(config, role, name)
        if foreground:
            raise typer.Exit(_run(paths, config, role, name, port))
        emit(_spawn(paths, config, role, name, port), json_output,
             lambda record: f"{role} {name} serving on {record['address']}")
    return command


def _run(paths: ClusterPaths, config: Config, role: str, name: str, port: int) -> int:
    for directory in (paths.run_dir, paths.log_dir):
        directory.mkdir(parents=True, exist_ok=True)
    # One cluster id per workdir (it names the shared memory `down` removes): the one already
    # recorded here, else a new one recorded now.
    cluster = read_json(paths.cluster_file)
    cluster_id = cluster["cluster_id"] if cluster else uuid.uuid4().hex[:8]
    if not cluster:
        write_json_atomic(paths.cluster_file, {"cluster_id": cluster_id, "workdir": str(paths.workdir),
                                               "started_at": time.time(), "daemons": []})
    write_json_atomic(paths.pidfile(name), {"pid": os.getpid(), "role": role, "cluster_id": cluster_id,
                                            "create_time": psutil.Process().create_time()})
    for stale in (paths.announce_file(name), paths.exit_file(name)):
        stale.unlink(missing_ok=True)
    return DAEMON_CLASSES[role](name, paths, config, cluster_id, port).run()


def preflight(config: Config, role: str, name: str) -> ClusterPaths:
    """Refuse to start when peers on other hosts could not reach our advertised address, or
    when a daemon of that name already runs in this workdir; returns the workdir's paths."""
    try:
        check_reachable(config, role)  # standbys and clients on other hosts find us at this address
    except MooncakeError as exc:
        fail_on(exc)
    paths = ClusterPaths.of(config.workdir)
    if name in live_daemons(paths):
        fail(f"a daemon named {name!r} already runs in {paths.workdir}; stop it with `mooncake down`")
    return paths


def _spawn(paths: ClusterPaths, config: Config, role: str, name: str, port: int) -> dict:
    return spawn_in_background(paths, config, role, name, ["--name", name, "--port", str(port)])


def spawn_in_background(paths: ClusterPaths, config: Config, role: str, name: str, args: list[str]) -> dict:
    """Run `start ROLE --foreground ARGS` in a new session; return its announce record once it
    answers a health check. The child reads the settings we resolved from a file, with the
    MOONCAKE_* variables taken out of its environment, so it resolves exactly our values."""
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    settings = paths.workdir / f"{name}-settings.yaml"
    settings.write_text(yaml.safe_dump(config.as_plain(), sort_keys=True))
    command = [sys.executable, "-m", "mooncake_cli", "start", role, "--foreground", *args,
               "--workdir", str(paths.workdir), "--config", str(settings)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    with open(paths.log_file(name), "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))
    deadline = time.monotonic() + config.start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            fail(f"the {role} exited with {process.returncode} during start-up; see {paths.log_file(name)}")
        record = read_json(paths.announce_file(name))
        if record and record.get("pid") == process.pid and _answers(record["address"]):
            return record
        time.sleep(0.05)
    process.terminate()
    fail(f"the {role} did not answer before the start timeout; see {paths.log_file(name)}")


def _answers(address: str) -> bool:
    with RpcClient(address, timeout=1.0) as client:
        try:
            client.call("health")
            return True
        except MooncakeError:
            return False
