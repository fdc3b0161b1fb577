"""`mooncake bench ...`: benchmarks that print a table (or --json) beside this machine's limits."""

from __future__ import annotations

import tempfile

import typer
from rich.table import Table

from mooncake_cli.commands import bench_failover, bench_prefill, bench_sched, bench_serve, bench_store, bench_transfer
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, LOAD_HELP, emit

app = typer.Typer(help="Measure speed against this machine's own limits.", no_args_is_help=True)

OUTSTANDING = (1, 8, 64)


@app.command("rpc")
@settings_options("rpc")
def rpc(
    requests: int = typer.Option(20000, min=100, help="Requests per throughput run."),
    load: int = typer.Option(0, min=0, help=LOAD_HELP),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Control-plane round trips against a master daemon this command starts and stops.

    Reports latency p50/p99 with one request outstanding and ops/s with 1, 8 and 64
    outstanding, over the master's TCP address (ZeroMQ) and over its unix:// stream socket
    (what clients on this host use), next to a bare echo over each transport measured in the
    same run (the floor: a ZeroMQ ROUTER for TCP, a plain Unix socket for unix://). On
    unix:// the client, the daemon and the floor busy-poll for --rpc-busy-poll before they
    sleep, as store clients do, while a core is free; ZeroMQ needs its I/O threads to run, so
    nothing spins on TCP. --load N runs N busy loops beside it all (the JSON says how many).
    """
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons import supervisor
    from daemons.cluster.directory import daemon_address, local_daemon_address
    from daemons.cluster.workdir import ClusterPaths
    from transfer.rpc.bench import CpuLoad, RawEchoServer, raw_latency, rpc_latency, rpc_throughput
    from transfer.auth import cluster_secret
    from transfer.rpc.client_server import RpcClient

    latency_count = max(100, requests // 4)
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as workdir, CpuLoad(load):
        # The master alone: idle workers would only add noise to a latency measurement.
        cluster_config = config.replace(workdir=workdir, store_clients=0, prefill_workers=0, decode_workers=0)
        supervisor.up(cluster_config)
        paths = ClusterPaths.of(workdir)
        try:
            endpoints = {"tcp": daemon_address(paths, "master")}
            local = local_daemon_address(paths, "master")
            if local != endpoints["tcp"]:
                endpoints["unix"] = local
            measured = {}
            for transport, address in endpoints.items():
                with RpcClient(address, timeout=config.rpc_timeout, busy_poll=config.rpc_busy_poll,
                               secret=cluster_secret(cluster_config)) as client:
                    measured[transport] = (rpc_latency(client, latency_count),
                                           {n: rpc_throughput(client, requests, n) for n in OUTSTANDING})
        finally:
            supervisor.down(paths, config.stop_grace)
        with RawEchoServer(workdir, config.rpc_busy_poll) as raw:
            floors = {"tcp": raw_latency(raw.address, latency_count),
                      "unix": raw_latency(raw.unix_path, latency_count, config.rpc_busy_poll)}

    def figures(transport: str) -> dict:
        latency, throughput = measured[transport]
        return {
            "latency_us": {"p50": latency.p50_us, "p99": latency.p99_us, "requests": latency.count},
            "ops_per_s": {str(n): ops for n, ops in throughput.items()},
            "floor_latency_us": {"p50": floors[transport].p50_us, "p99": floors[transport].p99_us},
        }

    # The top-level figures are the TCP ones; "unix" adds the same-host path.
    data = {**figures("tcp"), **({"unix": figures("unix")} if "unix" in measured else {}), "load": load}

    def render(d: dict) -> Table:
        views = [("tcp", d)] + ([("unix", d["unix"])] if "unix" in d else [])
        floors = {"tcp": "raw zmq echo tcp", "unix": "raw socket echo unix"}
        table = Table("measure", *(f"mooncake rpc {t}" for t, _ in views),
                      *(f"{floors[t]} (floor)" for t, _ in views),
                      title="control-plane RPC, this host" + (f", busy loops beside it: {d['load']}" if d["load"] else ""))
        for q in ("p50", "p99"):
            table.add_row(f"latency {q} (µs)", *(f"{v['latency_us'][q]:.0f}" for _, v in views),
                          *(f"{v['floor_latency_us'][q]:.0f}" for _, v in views))
        for n in d["ops_per_s"]:
            table.add_row(f"ops/s, {n} outstanding", *(f"{v['ops_per_s'][n]:,.0f}" for _, v in views),
                          *("" for _ in views))
        return table

    emit(data, json_output, render)


app.command("sched")(bench_sched.sched)
app.command("transfer")(bench_transfer.transfer)
app.command("store")(bench_store.store)
app.command("serve")(bench_serve.serve)
app.command("prefill")(bench_prefill.prefill)
app.command("failover")(bench_failover.failover)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="bench")
