"""`mooncake bench ...`: benchmarks that print a table (or --json) beside this machine's limits."""

from __future__ import annotations

import tempfile

import typer
from rich.table import Table

from daemons import supervisor
from daemons.paths import ClusterPaths
from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit
from transfer.rpc import RpcClient
from transfer.rpc_bench import RawEchoServer, raw_latency, rpc_latency, rpc_throughput

app = typer.Typer(help="Measure speed against this machine's own limits.", no_args_is_help=True)

OUTSTANDING = (1, 8, 64)


@app.command("rpc")
@settings_options("rpc")
def rpc(
    requests: int = typer.Option(20000, min=100, help="Requests per throughput run."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Control-plane round trips against a master daemon this command starts and stops.

    Reports latency p50/p99 with one request outstanding and ops/s with 1, 8 and 64
    outstanding, next to a bare ZeroMQ echo measured in the same run (the floor).
    """
    latency_count = max(100, requests // 4)
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as workdir:
        cluster_config = config.replace(workdir=workdir)
        supervisor.up(cluster_config)
        paths = ClusterPaths.of(workdir)
        try:
            with RpcClient(supervisor.daemon_address(paths, "master"), timeout=config.rpc_timeout) as client:
                latency = rpc_latency(client, latency_count)
                throughput = {n: rpc_throughput(client, requests, n) for n in OUTSTANDING}
        finally:
            supervisor.down(paths, config.stop_grace)
    with RawEchoServer() as raw:
        floor = raw_latency(raw.address, latency_count)
    data = {
        "latency_us": {"p50": latency.p50_us, "p99": latency.p99_us, "requests": latency.count},
        "ops_per_s": {str(n): ops for n, ops in throughput.items()},
        "floor_raw_zmq_latency_us": {"p50": floor.p50_us, "p99": floor.p99_us},
    }

    def render(d: dict) -> Table:
        table = Table("measure", "mooncake rpc", "raw zmq echo (floor)", title="control-plane RPC, loopback")
        table.add_row("latency p50 (µs)", f"{d['latency_us']['p50']:.0f}",
                      f"{d['floor_raw_zmq_latency_us']['p50']:.0f}")
        table.add_row("latency p99 (µs)", f"{d['latency_us']['p99']:.0f}",
                      f"{d['floor_raw_zmq_latency_us']['p99']:.0f}")
        for n, ops in d["ops_per_s"].items():
            table.add_row(f"ops/s, {n} outstanding", f"{ops:,.0f}", "")
        return table

    emit(data, json_output, render)
