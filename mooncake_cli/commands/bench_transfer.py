"""`mooncake bench transfer`: transfer engine GB/s, req/s and batch latency beside memcpy and raw TCP."""

from __future__ import annotations


import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit
from transfer.engine_options import EngineOptions
from transfer.settings import SIZE_UNITS_HELP, parse_size


@settings_options("transfer")
def transfer(
    protocol: str = typer.Option("auto", help="shm, tcp, rdma or auto (shm > rdma > tcp)."),
    op: str = typer.Option("write", help="read or write."),
    block_size: str = typer.Option("1MiB", help=f"Bytes per request, e.g. 64KiB, 16MiB. {SIZE_UNITS_HELP}"),
    batch_size: int = typer.Option(16, min=1, help="Requests per batch."),
    threads: int = typer.Option(1, min=1, help="Initiator threads, each with its own batches."),
    duration: float = typer.Option(3.0, min=0.1, help="Seconds to measure."),
    target: str | None = typer.Option(None, help="Use this running segment (P2P host:port) "
                                         "instead of starting a target process."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Move blocks to (or from) a target engine and compare with this machine's limits.

    The limits are measured in the same run for the same block size and the same working set
    (block x batch x threads, as the engine walks it): single-thread memcpy between two buffers
    of this process, and one raw TCP stream to another process, one sendall per block.
    """
    from transfer import bench

    if protocol not in ("auto", "shm", "tcp", "rdma") or op not in ("read", "write"):
        raise typer.BadParameter("--protocol is shm|tcp|rdma|auto and --op is read|write")
    try:
        size = parse_size(block_size)
    except ValueError:
        raise typer.BadParameter(f"--block-size {block_size!r} is not a byte count") from None
    result = bench.run(protocol=protocol, op=op, block_size=size, batch_size=batch_size,
                       threads=threads, duration=duration, target=target,
                       options=EngineOptions.from_config(config))

    def render(row: dict) -> Table:
        table = Table("protocol", "op", "block", "batch", "GB/s", "req/s", "p50 ms", "p99 ms",
                      "memcpy GB/s", "× memcpy", "socket GB/s", "× socket",
                      title="mooncake bench transfer")
        table.add_row(row["protocol"], row["op"], block_size, str(row["batch_size"]),
                      f"{row['gbps']:.2f}", f"{row['requests_per_s']:.0f}",
                      f"{row['batch_p50_ms']:.2f}", f"{row['batch_p99_ms']:.2f}",
                      f"{row['memcpy_gbps']:.2f}", f"{row['vs_memcpy']:.2f}",
                      f"{row['raw_socket_gbps']:.2f}", f"{row['vs_raw_socket']:.2f}")
        return table

    emit(result, json_output, render)


__all__ = ["transfer"]
