"""`mooncake up`, `mooncake status`, `mooncake down`: the life cycle of a single-host cluster."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from daemons.cluster.workdir import ClusterPaths
from daemons.errors import ClusterNotRunning, DaemonStartFailed
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import EXIT_FAILED, JSON_HELP, emit, fail, fail_on, fail_to_start, show_progress, stderr
from transfer.auth import cluster_secret
from transfer.errors import MooncakeError


def _daemon_table(daemons: list[dict], title: str) -> Table:
    table = Table("name", "role", "pid", "address", "metrics", "uptime", "health", title=title)
    for d in daemons:
        if d.get("healthy", True):
            health = "[green]healthy[/green]"
        elif d.get("alive"):
            health = "[yellow]not answering[/yellow]"
        else:
            health = f"[red]dead[/red]: {d.get('exit_reason')}"
        uptime = d.get("uptime_s")
        table.add_row(d["name"], d["role"], str(d.get("pid") or "-"), d.get("address") or "-",
                      d.get("metrics_url") or "-", f"{uptime:.1f}s" if uptime is not None else "-", health)
    return table


@settings_options("cluster", "metrics", "rpc", "topology", "transfer", "store", "scheduler", "model", "serving")
def up(json_output: bool = typer.Option(False, "--json", help=JSON_HELP), *, config: Config) -> None:
    """Start every daemon of a single-host cluster in the background and wait until all are healthy.

    Each daemon is its own process with a pidfile under <workdir>/run and a log under
    <workdir>/logs; bound addresses go to <workdir>/cluster.json. If a daemon fails to start,
    the ones already started are stopped and the failing daemon's log tail is shown.
    """
    # Imported in each command, not at the top: every `mooncake` call imports this module to
    # build its parser, and the supervisor brings the launcher, psutil and ZeroMQ.
    from daemons import supervisor
    from mooncake_cli.commands.start_role import check_model_device

    if config.prefill_workers or config.decode_workers:
        check_model_device(config)
    try:
        if show_progress():
            with stderr.status(f"starting the cluster in {config.workdir} ..."):
                cluster = supervisor.up(config)
        else:
            cluster = supervisor.up(config)
    except DaemonStartFailed as exc:
        fail_to_start(exc)
    except MooncakeError as exc:
        fail_on(exc)
    emit(cluster, json_output,
         lambda c: _daemon_table(c["daemons"], f"cluster {c['cluster_id']} up in {c['workdir']}"))


def _remote_table(data: dict) -> Table:
    master = data["master"]
    leading = {True: ", leading", False: ", NOT leading", None: ""}[master["leading"]]
    table = Table("name", "role", "address", "last seen", "segments", "health",
                  title=f"cluster of master {master['spec']} (answered by {master['address']}{leading})")
    for d in data["daemons"]:
        capacity, used = (sum(s[k] for s in d["segments"]) / 2**20 for k in ("capacity_bytes", "used_bytes"))
        segments = f"{len(d['segments'])}: {used:.1f} of {capacity:.1f} MiB used" if d["segments"] else "-"
        table.add_row(d["name"], d["role"], d["address"] or "-", f"{d['last_seen_ago']:.1f}s ago", segments,
                      "[green]alive[/green]" if d["alive"] else "[red]silent[/red]")
    return table


@settings_options("cluster", "rpc", "master")
def status(json_output: bool = typer.Option(False, "--json", help=JSON_HELP), *, config: Config) -> None:
    """Show each daemon's role, pid, address, metrics URL, uptime and health.

    With --master (an address or etcd://...), show instead the cluster as that master knows it,
    wherever its daemons run: the master (for etcd://, the elected leader), each store client with
    its segments and when the master last heard from it, and each registered service (the
    conductor), silent once it stops refreshing its registration.

    Exit code 0 when every daemon is healthy, 1 otherwise (a dead daemon shows as dead, with its
    exit reason when known; no cluster at all, or no master answering within --rpc-timeout, also
    exits 1).
    """
    from daemons import supervisor  # here for start-up time, as in up()

    if config.master:
        from daemons.cluster.remote_status import remote_status

        try:
            data = remote_status(config.master, config.rpc_timeout, cluster_secret(config))
        except MooncakeError as exc:
            fail(f"cannot read the cluster from the master {config.master}: {exc.message} ({exc.name})")
        emit(data, json_output, _remote_table)
        if not data["healthy"]:
            raise typer.Exit(EXIT_FAILED)
        return
    paths = ClusterPaths.of(config.workdir)
    states = [s.as_dict() for s in supervisor.status(paths, rpc_timeout=min(config.rpc_timeout, 1.0),
                                                   secret=cluster_secret(config))]
    if not states:
        fail(f"no cluster in {paths.workdir}: start one with `mooncake up`")
    data = {"workdir": str(paths.workdir), "healthy": all(s["healthy"] for s in states),
            "daemons": states, "checked_at": time.time()}
    emit(data, json_output, lambda d: _daemon_table(d["daemons"], f"cluster in {d['workdir']}"))
    if not data["healthy"]:
        raise typer.Exit(EXIT_FAILED)


@settings_options("cluster")
def down(json_output: bool = typer.Option(False, "--json", help=JSON_HELP), *, config: Config) -> None:
    """Stop the cluster: SIGTERM, then SIGKILL after --stop-grace; remove pidfiles and shared memory.

    Stopping a workdir with no cluster is not an error (exit 0; a note goes to stderr).
    """
    from daemons import supervisor  # here for start-up time, as in up()

    paths = ClusterPaths.of(config.workdir)
    try:
        outcome = supervisor.down(paths, config.stop_grace)
    except ClusterNotRunning as exc:
        stderr.print(f"note: {exc.message}", highlight=False)
        outcome = {"stopped": [], "killed": [], "shared_memory_removed": []}
    if json_output:
        emit(outcome, True, str)
    elif outcome["killed"]:
        stderr.print(f"killed after the grace period: {', '.join(outcome['killed'])}", highlight=False)


@settings_options("cluster")
def restart(
    name: str = typer.Argument(..., help="The daemon's name (as `mooncake status` lists it) or its role "
                                         "when only one daemon has it (master, conductor)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Restart one daemon of the running cluster: stop it (SIGTERM, SIGKILL after --stop-grace) if
    it runs, then start it again on its old control port, in the same cluster.

    The other daemons keep running and find it again by themselves; cluster.json keeps the
    cluster id and every other daemon's row. Exit code 0 once it answers health checks.
    """
    from daemons import supervisor  # here for start-up time, as in up()

    try:
        record = supervisor.restart_daemon(ClusterPaths.of(config.workdir), name, config)
    except DaemonStartFailed as exc:
        fail_to_start(exc)
    except MooncakeError as exc:
        fail_on(exc)
    emit(record, json_output, lambda r: f"{r['name']} restarted: pid {r['pid']}, serving on {r['address']}")


def register(root: typer.Typer) -> None:
    root.command("up")(up)
    root.command("status")(status)
    root.command("restart")(restart)
    root.command("down")(down)
