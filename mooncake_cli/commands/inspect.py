"""`mooncake inspect [segments|objects|clients|key KEY]`: the master's view of the store."""

from __future__ import annotations


import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail_on
from transfer.auth import client_credential
from transfer.errors import MooncakeError

VIEWS = ("counters", "segments", "objects", "clients", "key")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _left(seconds: float | None) -> str:
    return "-" if not seconds else f"{seconds:.1f}s"


def _replica(row: dict) -> str:
    return row["segment_id"] + (" (disk)" if row["tier"] == "LOCAL_DISK" else "")


def _render(what: str, data) -> Table:
    if what == "counters":
        table = Table("counter", "value", title="store")
        for name, value in data.items():
            table.add_row(name, f"{value:.3f}" if isinstance(value, float) else str(value))
        return table
    if what == "segments":
        table = Table("segment", "client", "capacity", "used", "free ratio", "replicas", "largest free",
                      title="segments")
        for s in data:
            drain = f" ({s['drain']})" if s.get("drain") else ""
            table.add_row(s["segment_id"] + drain, s["client_id"], _mib(s["capacity_bytes"]), _mib(s["used_bytes"]),
                          f"{s['free_ratio']:.3f}", str(s["num_replicas"]), _mib(s["largest_free_range"]))
        return table
    if what == "clients":
        table = Table("client", "registered", "last seen", "segments", "puts in flight", title="clients")
        for c in data:
            table.add_row(c["client_id"], str(c["registered"]), f"{c['last_seen_ago']:.1f}s ago",
                          ", ".join(c["segments"]) or "-", str(c["num_puts_in_flight"]))
        return table
    rows = [data] if what == "key" else data
    table = Table("key", "size", "state", "lease left", "soft pin left", "hard pin", "replicas", title="objects")
    for o in rows:
        table.add_row(o["key"], str(o["size"]), o["state"], _left(o["lease_left"]), _left(o["soft_pin_left"]),
                      "yes" if o["hard_pinned"] else "", ", ".join(_replica(r) for r in o["replicas"]))
    return table


@settings_options("cluster", "rpc", "master", "cluster_id", "tenant")
def inspect(
    what: str = typer.Argument("counters", help="counters (default: usage, free ratio, eviction "
                               "counters), segments, objects, clients, or key KEY."),
    key: str | None = typer.Argument(None, help="The object, with `key`."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Show the store as the master sees it.

    Segment usage and fragmentation, object states, leases, pins and replicas, clients and their
    liveness, and the eviction counters. `objects` and `key` are those of the --tenant only;
    counters, segments and clients are the whole pool's."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.cluster.store_access import master_of
    from store.master_client import MasterClient

    if what not in VIEWS:
        raise typer.BadParameter(f"expected one of {', '.join(VIEWS)}, got {what!r}")
    if (what == "key") != (key is not None):
        raise typer.BadParameter("give KEY exactly with `inspect key KEY`")
    try:
        master = MasterClient(master_of(config)[0], "inspect", config.rpc_timeout,
                              secret=client_credential(config), tenant=config.tenant)
        try:
            data = master.inspect(what, key)
        finally:
            master.close()
    except MooncakeError as exc:
        fail_on(exc)
    emit(data, json_output, lambda d: _render(what, d))


def register(root: typer.Typer) -> None:
    root.command("inspect")(inspect)
