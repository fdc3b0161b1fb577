"""`mooncake bench serve`: TTFT/TBT percentiles and hit rate of a trace slice, with and without reuse."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail_on, stderr
from transfer.errors import MooncakeError

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"


@settings_options("cluster", "request_timeout", "rpc_timeout", "master")
def serve(
    trace: Path = typer.Option(DEFAULT_TRACE, help="Trace file (JSONL: timestamp ms, input_length, "
                               "output_length, hash_ids)."),
    requests: int = typer.Option(200, min=1, help="Requests from the start of the trace."),
    max_blocks: int = typer.Option(8, min=1, help="Trace blocks kept per request (each becomes one "
                                   "KV block of the cluster's kv_block_tokens tokens)."),
    max_tokens: int = typer.Option(16, min=1, help="Output tokens per request at most."),
    speedup: float = typer.Option(5.0, min=0.01, help="Compress the trace's arrival times by this factor."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Replay a slice of a request trace against the running cluster, prefix reuse off then on.

    The cluster is the one in --workdir, or with --master the one whose conductor registered with
    that master; either way its conductor says the KV block size the trace is scaled to.

    Reports TTFT and TBT percentiles as the client sees them, the prefix hit rate and the TTFT
    ratio between the two runs."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.serving.bench import replay, scale
    from daemons.serving.client import find_conductor
    from scheduler.sim.trace import load_trace

    try:
        conductor = find_conductor(config)
        url, block = conductor["http_address"], conductor["kv_block_tokens"]
        slice_ = load_trace(trace, speedup=speedup, limit=requests)
        runs = []
        for reuse in (False, True):
            if not json_output:
                stderr.print(f"replaying {len(slice_)} requests, prefix reuse {'on' if reuse else 'off'} ...")
            scaled = scale(slice_, block, max_blocks, max_tokens, salt=f"reuse-{reuse}")
            runs.append(replay(url, scaled, reuse, config.request_timeout).summary())
    except MooncakeError as exc:
        fail_on(exc)
    off, on = runs
    data = {"trace": str(trace), "requests": len(slice_), "block_tokens": block, "max_blocks": max_blocks,
            "speedup": speedup, "runs": runs,
            "ttft_p50_speedup": (off["ttft_ms"]["p50"] / on["ttft_ms"]["p50"]
                                 if off["ttft_ms"]["p50"] and on["ttft_ms"]["p50"] else None)}

    def render(d: dict) -> Table:
        table = Table("prefix reuse", "done", "429", "failed", "TTFT p50", "TTFT p90", "TTFT p99",
                      "TBT p50", "TBT p99", "hit rate", "tok/s",
                      title=f"mooncake bench serve: {d['requests']} requests, {d['max_blocks']} blocks x "
                            f"{d['block_tokens']} tokens max, x{d['speedup']:g} (ms)")
        for r in d["runs"]:
            table.add_row("on" if r["prefix_reuse"] else "off", str(r["completed"]), str(r["rejected"]),
                          str(r["failed"]), *(_ms(r["ttft_ms"][q]) for q in ("p50", "p90", "p99")),
                          _ms(r["tbt_ms"]["p50"]), _ms(r["tbt_ms"]["p99"]), f"{r['hit_rate']:.1%}",
                          f"{r['tokens_per_s']:.0f}")
        if d["ttft_p50_speedup"]:
            table.caption = f"TTFT p50 without reuse / with reuse: {d['ttft_p50_speedup']:.2f}x"
        return table

    emit(data, json_output, render)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


__all__ = ["serve"]
