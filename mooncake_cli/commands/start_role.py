"""`mooncake start ROLE` for the roles other than the master: store-client, conductor, prefill, decode.

One daemon per command, for a deployment across hosts (systemd units, containers): the daemon
runs the same class `mooncake up` starts, with the pidfile and announce records `up` writes, so
`mooncake status` and `mooncake down` on that host see it. Every role finds its master with
``--master ADDR`` or ``--master etcd://host:port[,host:port][/cluster]`` (following the elected
leader); without it, the master of the same workdir. With ``--master`` the conductor registers
its addresses with the master and the workers find it there (:mod:`daemons.cluster.service_registry`),
so no two roles need to share a workdir or a host. Before starting, the advertised address is
checked: a loopback address advertised to a master or etcd on another host is refused.

Without --foreground the command runs itself again with --foreground through the launcher
(:mod:`daemons.launcher`: a new session, its records, waiting until the daemon answers) and
prints its address.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from daemons.cluster.workdir import ClusterPaths
from daemons.errors import DaemonStartFailed
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail, fail_on, fail_to_start
from transfer.errors import MooncakeError
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
            # Imported here, not at the top: every `mooncake` call imports this module to build
            # its parser, and the launcher brings psutil and ZeroMQ.
            from daemons.launcher import run_in_foreground
            from daemons.roles import DAEMON_CLASSES

            raise typer.Exit(run_in_foreground(
                paths, role, name, lambda cluster_id: DAEMON_CLASSES[role](name, paths, config, cluster_id, port)))
        emit(launch(paths, config, role, name, ["--name", name, "--port", str(port)]), json_output,
             lambda record: f"{role} {name} serving on {record['address']}")
    return command


def preflight(config: Config, role: str, name: str) -> ClusterPaths:
    """Refuse to start when peers on other hosts could not reach our advertised address, when
    a daemon of that name already runs in this workdir, or when a worker's model_device is not
    on this host; returns the workdir's paths."""
    from daemons.cluster.advertise import check_reachable  # here for start-up time, as in _command
    from daemons.cluster.workdir import checked_name
    from daemons.launcher import live_daemons
    from transfer.auth import keep_secret_file

    try:
        checked_name(name)  # before anything is written: the name becomes file names
        check_reachable(config, role)  # standbys and clients on other hosts find us at this address
    except MooncakeError as exc:
        fail_on(exc)
    if role in ("prefill", "decode"):
        check_model_device(config)
    paths = ClusterPaths.of(config.workdir)
    if name in live_daemons(paths):
        fail(f"a daemon named {name!r} already runs in {paths.workdir}; stop it with `mooncake down`")
    paths.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        keep_secret_file(config)
    except MooncakeError as exc:
        fail_on(exc)
    return paths


def check_model_device(config: Config) -> None:
    """Refuse a model_device this host lacks (cuda without CUDA) in one line, before any daemon
    starts, rather than with a worker's crash and its log."""
    if config.model_device == "cpu":
        return  # the CPU is always there, and checking a GPU imports torch (seconds)
    from daemons.model.device import model_device

    try:
        model_device(config.model_device)
    except MooncakeError as exc:
        fail_on(exc)


def launch(paths: ClusterPaths, config: Config, role: str, name: str, args: list[str]) -> dict:
    """`start ROLE --foreground ARGS` in the background; its announce record once it answers."""
    from daemons.launcher import start_in_background  # here for start-up time, as in _command

    try:
        return start_in_background(paths, config, name,
                                   [sys.executable, "-m", "mooncake_cli", "start", role, "--foreground", *args])
    except DaemonStartFailed as exc:
        fail_to_start(exc)
