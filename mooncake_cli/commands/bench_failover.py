"""`mooncake bench failover`: how long a SIGKILLed master leaves the store unable to take a put.

Starts a private etcd on loopback, two masters with ha_backend etcd (A leads, B stands by) and a
store client, puts objects, SIGKILLs A, and times the first put that succeeds again (B elected,
the clients following it, the store client re-mounted). It then checks every object is back with
the right bytes. The failover time is bounded by the lease TTL: the kill cannot revoke A's lease.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.table import Table

from mooncake_cli.output import JSON_HELP, emit, fail
from transfer.settings import SIZE_UNITS_HELP, parse_duration, parse_size


def failover(
    objects: int = typer.Option(200, min=1, help="Objects put before the kill."),
    size: str = typer.Option("4KiB", help=f"Size of each object. {SIZE_UNITS_HELP}"),
    lease_ttl: str = typer.Option("2s", help="The masters' etcd lease TTL (Mooncake's default is 5s)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Time a master failover on etcd: SIGKILL of the leader -> first successful put."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.ha.etcd_server import EtcdServer
    from daemons.ha.failover_scenario import run_failover

    try:
        object_size, ttl = parse_size(size), parse_duration(lease_ttl)
    except ValueError:
        raise typer.BadParameter("--size takes a byte count (4KiB), --lease-ttl a duration (2s)") from None
    with tempfile.TemporaryDirectory(prefix="mooncake-failover-") as scratch:
        etcd = EtcdServer(Path(scratch) / "etcd")
        try:
            etcd.wait_ready()
            result = run_failover(Path(scratch) / "cluster", etcd.endpoints, objects, object_size, ttl)
        except TimeoutError as exc:
            fail(f"the failover did not complete: {exc}")
        finally:
            etcd.stop()

    def render(r: dict) -> Table:
        table = Table("measure", "value", title="mooncake bench failover (SIGKILL of the leading master)")
        table.add_row("lease TTL", f"{r['lease_ttl_s']:.1f} s")
        table.add_row("kill -> first successful put", f"{r['failover_s']:.2f} s")
        table.add_row("kill -> all objects back", f"{r['failover_s'] + r['all_readable_s']:.2f} s")
        table.add_row("objects with wrong bytes", f"{r['wrong_bytes']} of {r['num_objects']}")
        table.add_row("leader", f"{r['leader_before']} -> {r['leader_after']}")
        return table
    emit(result, json_output, render)
