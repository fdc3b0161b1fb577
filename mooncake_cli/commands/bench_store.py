"""`mooncake bench store`: put/get GB/s, ops/s and p50/p99 for the two segment placements."""

from __future__ import annotations

import tempfile

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, LOAD_HELP, emit, fail_on, stderr
from transfer.errors import MooncakeError
from transfer.settings import SIZE_UNITS_HELP, parse_size

SIZES = ("4KiB", "64KiB", "1MiB", "16MiB")


@settings_options("cluster", "rpc", "transfer", "checksum", "reuse_read_leases", "put_reservations", "segment_size",
                  "segment_prefault", "master", "cluster_id")
def store(
    sizes: str = typer.Option(",".join(SIZES), help=f"Comma-separated value sizes. {SIZE_UNITS_HELP}"),
    batch: int = typer.Option(32, min=1, help="Objects per batch call."),
    duration: float = typer.Option(1.0, min=0.05, help="Seconds per cell at most."),
    budget: str = typer.Option("256MiB", help=f"Bytes of objects one cell writes at most. {SIZE_UNITS_HELP}"),
    use_running: bool = typer.Option(False, "--use-running", help="Benchmark the cluster in "
                                     "--workdir instead of starting (and stopping) a fresh one "
                                     "(implied by --master)."),
    load: int = typer.Option(0, min=0, help=LOAD_HELP),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Put and get GB/s, ops/s and p50/p99, single and batch, in two segment placements.

    `remote`: the segment is a store-client daemon's, another process on this host (shared
    memory), or with --master, a store client of that cluster wherever it runs. `local`: the
    segment belongs to this benchmarking process. With --master (an address or etcd://...) the
    running cluster of that master is measured and no cluster is started.

    Each cell runs its puts once untimed and removes them before its timed puts, so these write
    pool memory written once before, as a serving store's is: neither the page faults of memory
    never written (--no-segment-prefault) nor this VM's cost of touching memory idle since the
    segment was committed is counted as the store's speed. The gets cycle over the keys the
    puts wrote: within half a lease_ttl of its last get a key is read again through the lease
    that get was granted, without asking the master: from its second read in the single cells,
    from its third in the batch ones (--no-reuse-read-leases: every get asks).

    With --load N, N busy loops run beside the cells (not beside the cluster's start): the
    figures of a host another program keeps busy, where a thread that polls holds a core its
    peer needs; each row of the JSON says how many ran."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons import supervisor
    from daemons.cluster.workdir import ClusterPaths
    from transfer.rpc.bench import CpuLoad

    try:
        values = [parse_size(s) for s in sizes.split(",")]
        limit = parse_size(budget)
    except ValueError:
        raise typer.BadParameter("--sizes and --budget take byte counts such as 4KiB,1MiB") from None
    use_running = use_running or bool(config.master)
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as scratch:
        if not use_running:
            # A store-only cluster: serving daemons would only add noise to the measurement.
            config = config.replace(workdir=scratch, segment_size=max(config.segment_size, 2 * limit),
                                    prefill_workers=0, decode_workers=0)
            supervisor.up(config)
        paths = ClusterPaths.of(config.workdir)
        try:
            with CpuLoad(load):
                cells = _run(config, values, batch, duration, limit)
        except MooncakeError as exc:
            fail_on(exc)
        finally:
            if not use_running:
                supervisor.down(paths, config.stop_grace)
    rows = [{**c.as_dict(), "load": load} for c in cells]

    def render(data: list[dict]) -> Table:
        table = Table("segment", "op", "mode", "size", "GB/s", "ops/s", "p50 µs", "p99 µs", "held lease",
                      title="mooncake bench store (p50/p99 per call: one object, or one batch; held lease: "
                            "share of the gets read without asking the master)"
                            + (f", busy loops beside it: {load}" if load else ""))
        for r in data:
            table.add_row(r["topology"], r["op"], f"{r['mode']}×{r['batch']}" if r["mode"] == "batch" else r["mode"],
                          _size(r["size"]), f"{r['gbps']:.2f}", f"{r['ops_per_s']:,.0f}",
                          f"{r['p50_us']:.0f}", f"{r['p99_us']:.0f}",
                          f"{r['lease_reuses'] / r['ops']:.0%}" if r["op"] == "get" else "")
        return table

    emit(rows, json_output, render)


def _run(config: Config, sizes: list[int], batch: int, duration: float, limit: int) -> list:
    from daemons.cluster.store_access import connect  # here for start-up time, as in store()
    from store.bench import run_size

    cells = []
    with connect(config, segment_size=2 * limit) as client:
        own = client.owner.segment.segment_id
        others = [s["segment_id"] for s in client.master.inspect("segments") if s["segment_id"] != own]
        placements = [("remote", others[0])] if others else []
        if not others:
            stderr.print("note: the cluster has no store-client daemon; only `local` is measured")
        for topology, segment_id in [*placements, ("local", own)]:
            for size in sizes:
                cells += run_size(client, topology, segment_id, size, batch, duration, limit)
    return cells


def _size(n: int) -> str:
    return f"{n >> 20}MiB" if n >= 2**20 else f"{n >> 10}KiB" if n >= 1024 else f"{n}B"


__all__ = ["store"]
