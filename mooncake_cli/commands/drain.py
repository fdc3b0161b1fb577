"""`mooncake drain SEGMENT`: move a segment's objects to the other segments, then let it leave."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import EXIT_FAILED, JSON_HELP, emit, fail, fail_on, show_progress
from transfer.errors import MooncakeError


def _render(report: dict) -> Table:
    table = Table("", "", title=f"drain of {report['segment_id']}: {report['outcome']}", show_header=False)
    table.add_row("moved", f"{report['moved']} objects, {report['bytes_moved'] / 2**20:.1f} MiB")
    table.add_row("already replicated", f"{report['already_replicated']} (their replica here dropped)")
    table.add_row("left", str(report["num_left"]))
    for item in report["left"]:
        table.add_row(f"  {item['key']}", item["reason"])
    return table


@settings_options("cluster", "rpc", "transfer", "checksum", "master", "cluster_id",
                  "client_ttl", "ping_interval", "put_start_discard_timeout")
def drain(
    segment: str = typer.Argument(..., help="The segment's id, as `mooncake inspect segments` lists it."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Move every object held only on SEGMENT to other segments, then unmount SEGMENT.

    From the start no new replica goes to SEGMENT (puts, copies and promotions pick other
    segments), and its objects stay readable throughout: each one is copied, through this
    command's process, to a segment the master's placement picks, and the new replica is
    published as the old one is dropped. Objects also held on another segment are not moved;
    their replica on SEGMENT is dropped at the end. Readers holding a lease may keep reading
    SEGMENT: its owner unmounts it, and frees the memory, only once those leases ran out (at
    most the master's lease_ttl after the last object moved). The owner's store client then
    keeps running without a segment until it is stopped.

    Refused before anything moves: an unknown SEGMENT, objects held only on SEGMENT that do
    not fit in the other segments' free bytes (no eviction is done to make room), objects held
    only on its SSD tier, a drain of SEGMENT that another live client runs. Running it again
    after an interruption resumes.

    An object that cannot be moved (room taken meanwhile, a put in flight there for longer
    than --put-start-discard-timeout, repeated transfer failures) stops the drain and is listed
    with the reason. A stopped or interrupted (Ctrl-C) drain is cancelled: SEGMENT stays
    mounted and serving, and takes new replicas again once the leases on what was dropped
    there ran out; what was moved stays moved.

    A progress bar on a terminal; --json prints the counts: moved, already_replicated, left
    (each with its reason). Exit 0 once SEGMENT is unmounted, 1 otherwise.
    """
    from daemons.cluster.store_access import connect
    from store.drain.drainer import Drainer

    try:
        with connect(config) as client:
            with _progress_bar(segment, show_progress() and not json_output) as on_progress:
                drainer = Drainer(client, segment, on_progress=on_progress,
                                  unmount_timeout=config.client_ttl + 2 * config.ping_interval + config.rpc_timeout,
                                  in_flight_wait=config.put_start_discard_timeout)
                try:
                    report = drainer.run()
                except KeyboardInterrupt:
                    fail(f"drain interrupted: segment {segment} stays mounted and serving; "
                         f"{drainer.report.num_moved} objects moved off it stay moved")
    except MooncakeError as exc:
        fail_on(exc)
    emit(report.as_json(), json_output, _render)
    if report.outcome != "unmounted":
        why = ("its owner did not unmount it in time" if report.outcome == "not unmounted"
               else f"{report.num_left} objects are still held only there; it stays mounted and serving")
        fail(f"segment {segment} was not unmounted: {why}", EXIT_FAILED)


@contextmanager
def _progress_bar(segment: str, shown: bool) -> Iterator[Callable]:
    """A rich progress bar on stderr while the drain runs, or nothing (scripts and --json)."""
    if not shown:
        yield lambda progress: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"draining {segment}", total=None)
        yield lambda p: bar.update(task, completed=p.moved, total=p.total, description=f"{p.phase} {segment}")


def register(root: typer.Typer) -> None:
    root.command("drain")(drain)
