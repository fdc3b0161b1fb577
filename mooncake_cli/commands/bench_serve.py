"""`mooncake bench serve`: TTFT/TBT percentiles and hit rate of a trace slice, with and without reuse;
with ``--hosts N``, the live Figure 5: each scheduling policy on a cluster over N network namespaces."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail, fail_on, stderr
from scheduler.config import POLICIES
from scheduler.sim.trace import CONVERSATION_TRACE
from transfer.errors import MooncakeError

DEFAULT_TRACE = CONVERSATION_TRACE


@settings_options("cluster", "request_timeout", "rpc_timeout", "master")
def serve(
    trace: Path = typer.Option(DEFAULT_TRACE, help="Trace file (JSONL: timestamp ms, input_length, "
                               "output_length, hash_ids; xz-compressed if its name ends in .xz). The "
                               "default is the paper's conversation trace, shipped with the package."),
    requests: int = typer.Option(200, min=1, help="Requests from the start of the trace (with --min-turns, "
                                 "from the start of those conversations)."),
    min_turns: int = typer.Option(1, "--min-turns", min=1, help="Keep only the requests of conversations "
                                  "with at least this many turns in the trace (a conversation: the first two "
                                  "trace blocks); 1 keeps every request. Arrivals then start at 0."),
    max_blocks: int = typer.Option(8, min=1, help="Trace blocks kept per request (each becomes one "
                                   "KV block of the cluster's kv_block_tokens tokens)."),
    max_tokens: int = typer.Option(16, min=1, help="Output tokens per request at most."),
    speedup: float = typer.Option(5.0, min=0.01, help="Compress the trace's arrival times by this factor."),
    hosts: int = typer.Option(0, "--hosts", min=0, help="Instead of the running cluster: start one over N "
                              "prefill hosts (network namespaces; needs root) plus a head host, once per --policy."),
    link_gbps: float | None = typer.Option(None, "--link-gbps", min=0.001, help="With --hosts: shape every "
                                           "host's link to this many Gbit/s each way (tc tbf)."),
    policy: str = typer.Option(",".join(POLICIES), "--policy", help="With --hosts: comma list of "
                               "random, load, cache, kvcentric; one cold cluster each."),
    block_tokens: int = typer.Option(32, "--block-tokens", min=1, help="With --hosts: the cluster's "
                                     "kv_block_tokens (each trace block becomes one such block)."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Replay a slice of a request trace against the running cluster, prefix reuse off then on.

    The cluster is the one in --workdir, or with --master the one whose conductor registered with
    that master; either way its conductor says the KV block size the trace is scaled to.

    Reports TTFT and TBT percentiles as the client sees them, the prefix hit rate and the TTFT
    ratio between the two runs.

    With --hosts N it builds its own cluster instead (the live Figure 5): a head namespace (master,
    conductor, decode) and N hosts (store client + prefill worker each) on a bridge, replays the
    slice with prefix reuse once per policy on a cold cluster (its workers started one at a time,
    so that each profiles its costs alone; before the replay, two untimed warm-up requests per
    host with prefix reuse off, counted in `warmup` and in no figure: a worker's first request
    pays start-up no policy causes), and reports per policy TTFT/TBT (seconds), where the
    mean TTFT went (`ttft_parts`), hit rate, the conductor's decisions, replicas and rejections,
    and the costs its conductor planned with from the workers' profiles (`costs_profiled`) and
    at the end, refitted from what it served (`costs_refitted`). Beside them, the simulator's
    prediction for the same slice, priced with that run's refitted costs, its conductor starting
    from the same profiled costs and learning as the live one: with every instance computing on
    this machine's cores together, as the hosts do (`sim`, on `sim_cores` cores), and with one
    compute per instance, as in the paper (`sim_dedicated`). A run's costs carry its own load (a
    policy that computes more slows every prefill on shared cores, and so does whatever else ran),
    so `sim_averaged` also prices every policy alike, at the runs' costs averaged
    (`averaged_costs`): how it differs from `sim` is what a row's prediction owes to its run's
    own costs rather than to the simulated policy."""
    if hosts:
        _serve_on_hosts(trace, requests, min_turns, max_blocks, max_tokens, speedup, hosts, link_gbps, policy, block_tokens,
                        json_output, config)
        return
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.serving.bench import replay, scale
    from daemons.serving.client import find_conductor

    try:
        conductor = find_conductor(config)
        url, block = conductor["http_address"], conductor["kv_block_tokens"]
        slice_ = _slice(trace, speedup, requests, min_turns)
        runs = []
        for reuse in (False, True):
            if not json_output:
                stderr.print(f"replaying {len(slice_)} requests, prefix reuse {'on' if reuse else 'off'} ...")
            scaled = scale(slice_, block, max_blocks, max_tokens, salt=f"reuse-{reuse}")
            runs.append(replay(url, scaled, reuse, config.request_timeout).summary())
    except MooncakeError as exc:
        fail_on(exc)
    off, on = runs
    data = {"trace": str(trace), "requests": len(slice_), "min_turns": min_turns, "block_tokens": block, "max_blocks": max_blocks,
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


def _slice(trace: Path, speedup: float, requests: int, min_turns: int) -> list:
    """The replayed requests: the first ``requests`` of the trace, or of its conversations with
    at least ``min_turns`` turns (read whole: a conversation's turns are spread over it)."""
    from scheduler.sim.trace import load_trace, multi_turn

    if min_turns == 1:
        return load_trace(trace, speedup=speedup, limit=requests)
    return multi_turn(load_trace(trace, speedup=speedup), min_turns)[:requests]


def _serve_on_hosts(trace: Path, requests: int, min_turns: int, max_blocks: int, max_tokens: int, speedup: float, hosts: int,
                    link_gbps: float | None, policy: str, block_tokens: int, json_output: bool,
                    config: Config) -> None:
    from daemons.serving.bench import scale
    from daemons.serving.bench_hosts import missing_prerequisites, run_figure5
    from daemons.serving.figure5 import TTFT_PARTS

    policies = [p.strip() for p in policy.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        raise typer.BadParameter(f"--policy must be a comma list of {', '.join(POLICIES)}; got {policy!r}")
    why = missing_prerequisites()
    if why:
        fail(why)
    try:
        slice_ = _slice(trace, speedup, requests, min_turns)
        scaled = scale(slice_, block_tokens, max_blocks, max_tokens, salt="hosts")
        if not json_output:
            stderr.print(f"replaying {len(slice_)} requests on {hosts} prefill hosts + 1 head, "
                         f"policies {', '.join(policies)} ...")
        result = run_figure5(hosts, policies, slice_, scaled, max_blocks=max_blocks, block_tokens=block_tokens,
                             link_gbps=link_gbps, request_timeout=config.request_timeout,
                             start_timeout=max(config.start_timeout, 120.0))
    except MooncakeError as exc:
        fail_on(exc)
    data = {"trace": str(trace), "hosts": hosts, "link_gbps": link_gbps, "requests": len(slice_), "min_turns": min_turns,
            "block_tokens": block_tokens, "max_blocks": max_blocks, "max_tokens": max_tokens, "speedup": speedup,
            **result}

    def render(d: dict) -> Table:
        # Short headers keep the table readable in 80 columns; units and meanings are in the caption.
        table = Table("policy", "ok/429/err", "TTFT", "p50", "p99", "TBT", "hit", "L/X/R/M", "repl", "load",
                      "sim TTFT", "sim p99", "ded TTFT",
                      title=f"mooncake bench serve --hosts {d['hosts']}: {d['requests']} requests, link "
                            f"{d['link_gbps'] or 'unshaped'} Gbps, x{d['speedup']:g}", caption_justify="left",
                      caption="TTFT mean/p50/p99 and TBT mean in ms; hit: token hit rate; L/X/R/M: local hit, "
                              "transfer, recompute, miss decisions; repl: replicated blocks; load: 1-min load "
                              "average after the run; sim: the simulator on the same slice and cluster, priced "
                              "with the run's costs, every instance on this machine's "
                              f"{d['sim_cores']} cores; ded: the simulator with one compute per instance")
        for name, row in d["policies"].items():
            t, sim = row["ttft"], (row.get("sim") or {}).get("ttft") or {}
            dedicated = (row.get("sim_dedicated") or {}).get("ttft") or {}
            counts = "/".join(str(row["decisions"][k]) for k in ("local_hit", "transfer", "recompute", "miss"))
            table.add_row(name, f"{row['completed']}/{row['rejected']}/{row['failed']}",
                          *(_ms_of(t[q]) for q in ("mean", "p50", "p99")), _ms_of(row["tbt"]["mean"]),
                          f"{row['hit_rate']:.0%}", counts, "-" if row["replicas"] is None else str(row["replicas"]),
                          f"{row['load_average']:.1f}", _ms_of(sim.get("mean")), _ms_of(sim.get("p99")),
                          _ms_of(dedicated.get("mean")))
        table.caption += f"\nreuse ceiling of the slice (every block ever seen cached): {d['reuse_ceiling']:.0%}"
        warmups = [row["warmup"] for row in d["policies"].values()]
        table.caption += ("\nbefore each replay, untimed and in no figure: warm-up requests (prefix reuse off) "
                          + ", ".join(f"{w['completed']}/{w['requests']}" for w in warmups) + " served")
        table.caption += "\nTTFT parts, mean ms live (sim): " + " / ".join(TTFT_PARTS)
        for name, row in d["policies"].items():
            sim_parts = (row.get("sim") or {}).get("ttft_parts") or {}
            table.caption += f"\n  {name}: " + " / ".join(
                f"{_ms_of(row['ttft_parts'][part])} ({_ms_of(sim_parts.get(part))})" for part in TTFT_PARTS)
        averaged = {name: (row.get("sim_averaged") or {}).get("ttft", {}).get("mean")
                    for name, row in d["policies"].items()}
        if any(averaged.values()):
            table.caption += ("\nsim with every policy priced alike (the runs' costs averaged), TTFT mean ms: "
                              + ", ".join(f"{name} {_ms_of(mean)}" for name, mean in averaged.items()))
        table.caption += "\nprefill s = c0 + c1 x new + c2 x pairs, profiled -> refitted:"
        for name, row in d["policies"].items():
            before, after = row.get("costs_profiled"), row.get("costs_refitted")
            if before and after:
                table.caption += (f"\n  {name}: {_coef(before['prefill_coef'])} -> {_coef(after['prefill_coef'])}"
                                  f"; pulls at {after['transfer_bandwidth'] / 1e6:.0f} MB/s")
        return table

    emit(data, json_output, render)


def _ms_of(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _coef(terms: list[float]) -> str:
    return ", ".join(f"{c:.3g}" for c in terms)


__all__ = ["serve"]
