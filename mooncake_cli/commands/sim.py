"""`mooncake sim TRACE`: replay a request trace through the conductor's policy on a simulated
cluster, and compare policies, admission controls, thresholds and cache scopes side by side."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Column, Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit, fail, fail_on
from scheduler.config import ADMISSIONS, POLICIES, SchedulerConfig, parse_threshold
from transfer.errors import MooncakeError

if TYPE_CHECKING:
    from scheduler.sim.engine import SimSetup


def _choices(text: str | None, allowed: tuple[str, ...], default: str, what: str) -> list[str]:
    values = [v.strip() for v in (text or default).split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise typer.BadParameter(f"{what} must be a comma list of {', '.join(allowed)}; got {text!r}")
    return values


def _thresholds(text: str | None, default: int | None) -> list[int | None]:
    if not text:
        return [default]
    try:
        return [parse_threshold(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"--threshold-sweep takes token counts or auto, got {text!r}") from None


def sim(
    trace: Path = typer.Argument(..., help="Trace file (JSONL: timestamp ms, input_length, output_length, hash_ids)."),
    prefill: int = typer.Option(16, "--prefill", min=1, help="Prefill instances."),
    decode: int = typer.Option(16, "--decode", min=1, help="Decode instances."),
    policy: str | None = typer.Option(None, "--policy", help="Comma list of random, load, cache, kvcentric "
                                         "(one run each) (default: the schedule_policy setting)."),
    admission: str | None = typer.Option(None, "--admission", help="Comma list of none, early, predictive "
                                            "(default: the admission_policy setting)."),
    threshold_sweep: str | None = typer.Option(None, "--threshold-sweep", help="Comma list of "
                                                  "kvcache_balancing_threshold values (tokens or auto), one run each."),
    compare_scopes: bool = typer.Option(False, "--compare-scopes", help="Figure 10: run with one shared pool of "
                                        "prefill x cache_capacity_tokens (global) and with private per-instance caches "
                                        "of cache_capacity_tokens each (local)."),
    speedup: float = typer.Option(1.0, "--speedup", min=0.01, help="Replay this many times faster (2 overloads)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Replay only the first N requests."),
    capacity_sweep_: bool = typer.Option(False, "--capacity-sweep", help="Also report LRU hit rate against "
                                         "cache capacity (0.25M..100M tokens and infinite)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write a PNG: TTFT CDF per run, hit rate against "
                                        "capacity, load over time per admission policy."),
    cpp_group: int = typer.Option(1, "--cpp-group", min=1, help="Also replay with the prefill nodes in "
                                  "CPP groups of X (prefill/X instances, each pipelining prompts longer than "
                                  "prefill_chunk over its X nodes), and compare prefill time against prompt length."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Replay TRACE through the conductor (Algorithm 1, hot-block replication, early rejection).

    Cost model (LLaMA-70B class on 8xA800 per instance): 320 KiB KV per token, 100 Gbps per node,
    prefill 20 ms + 1.12e-4 s/token + 2.1e-9 s per causal token pair, decode step 30 ms + 1.5 ms
    per sequence + 0.1 us per context token. Reports TTFT/TBT mean and percentiles, goodput
    (requests within both SLOs), rejections, token hit rate and prefill GPU seconds (and those
    wasted on requests rejected at decode after their prefill).
    """
    # Imported here, not at the top: every `mooncake` call imports this module to build its
    # parser, and the simulator brings numpy.
    from scheduler.cpp import ttft_curve
    from scheduler.sim.cost_model import CostModel
    from scheduler.sim.engine import SimSetup, simulate
    from scheduler.sim.sweep import capacity_sweep
    from scheduler.sim.trace import load_trace

    try:
        base = SchedulerConfig.from_config(config)
    except MooncakeError as exc:
        raise typer.BadParameter(exc.message) from None
    policies = _choices(policy, POLICIES, base.policy, "--policy")
    admissions = _choices(admission, ADMISSIONS, base.admission, "--admission")
    thresholds = _thresholds(threshold_sweep, base.threshold)
    try:
        requests = load_trace(trace, speedup=speedup, limit=limit)
    except MooncakeError as exc:
        fail_on(exc)
    if not requests:
        fail(f"{trace}: no requests")
    cost = CostModel(bytes_per_token=config.kv_bytes_per_token, bandwidth=float(config.kv_transfer_bandwidth),
                     decode_kv_capacity=config.decode_kv_capacity_tokens)
    capacity, pool = config.cache_capacity_tokens, config.pool_capacity_tokens
    setups = {base.transfers: SimSetup(prefill, decode, capacity, pool, cost)}
    if compare_scopes:  # same memory per instance, either private or pooled in the store
        setups = {True: SimSetup(prefill, decode, 0, pool + prefill * capacity, cost),
                  False: SimSetup(prefill, decode, capacity, 0, cost)}
    layouts = [(1, setups)]
    data_cpp = None
    if cpp_group > 1:
        layouts.append((cpp_group, {scope: _grouped(s, cpp_group, config.prefill_chunk) for scope, s in setups.items()}))
        group_model = next(iter(layouts[1][1].values())).cost.prefill
        data_cpp = {"group": cpp_group, "chunk": config.prefill_chunk,
                    "curve": ttft_curve(cost.prefill, group_model, [2**k * 1024 for k in range(8)])}
    runs, results = [], []
    for (group, grouped), pol, adm, thr, scope in itertools.product(layouts, policies, admissions, thresholds,
                                                                    setups):
        cfg = base.with_(policy=pol, admission=adm, threshold=thr, transfers=scope)
        result = simulate(requests, cfg, grouped[scope])
        result.params.update(policy=pol, admission=adm, threshold="auto" if thr is None else thr,
                             scope="global" if scope else "local", cpp_group=group)
        results.append(result)
        runs.append(result.summary(with_samples=True))
    data = {"trace": str(trace), "prefill": prefill, "decode": decode, "speedup": speedup,
            "ttft_slo": base.ttft_slo, "tbt_slo": base.tbt_slo, "runs": runs}
    if data_cpp is not None:
        data["cpp"] = data_cpp
    if capacity_sweep_:
        data["capacity_sweep"] = capacity_sweep(requests)
    if plot is not None:
        from mooncake_cli.commands.sim_plot import write_plot

        write_plot(plot, results, data.get("capacity_sweep"))
        data["plot"] = str(plot)
    emit(data, json_output, _render)


def _grouped(setup: SimSetup, group: int, chunk: int) -> SimSetup:
    """The same nodes as CPP groups of ``group``: fewer instances, each with the memory of its
    nodes and the group's prefill time model."""
    from scheduler.cpp import CppPrefillTimeModel  # here for start-up time, as in sim()

    cost = setup.cost
    hop = chunk * cost.activation_bytes_per_token / cost.bandwidth + cost.link_latency
    model = CppPrefillTimeModel(cost.prefill, group, chunk, hop)
    capacity = setup.cache_capacity_tokens
    return dataclasses.replace(setup, num_prefill=max(1, setup.num_prefill // group),
                               cache_capacity_tokens=None if capacity is None else capacity * group,
                               cost=dataclasses.replace(cost, prefill=model))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _render(data: dict) -> Table:
    title = (f"{data['trace']}: {data['prefill']}P+{data['decode']}D, x{data['speedup']:g}, "
             f"SLO TTFT {data['ttft_slo']:g}s TBT {data['tbt_slo'] * 1000:g}ms")
    # Short headers keep the table readable in 80 columns; units are in the caption.
    numbers = [Column(h, no_wrap=True) for h in ("rej", "good", "TTFT", "TTFT99", "TBT", "TBT99", "hit", "GPU/waste")]
    table = Table(Column("run"), *numbers, title=title, caption_justify="left",
                  caption="TTFT mean/p99 in s, TBT mean/p99 in ms, hit: token hit rate, GPU/waste: prefill GPU s, "
                          "and of those spent on requests then rejected at decode")
    for run in data["runs"]:
        t, b = run["ttft"], run["tbt"]
        group = f" cpp{run['cpp_group']}" if run["cpp_group"] > 1 else ""
        table.add_row(f"{run['policy']} {run['admission']}\n{run['threshold']} {run['scope']}{group}",
                      str(run["rejected"]), str(run["goodput"]), _s(t["mean"]), _s(t["p99"]),
                      _ms(b["mean"]), _ms(b["p99"]), f"{run['hit_rate']:.0%}",
                      f"{run['prefill_gpu_seconds']:.0f}/{run['wasted_prefill_seconds']:.0f}")
    if "cpp" in data:
        cpp = data["cpp"]
        table.caption += f"\nfresh-prompt prefill s, one node vs a CPP group of {cpp['group']} (chunk {cpp['chunk']}):"
        for row in cpp["curve"]:
            table.caption += (f"\n  {row['tokens']:>7,} tokens: {row['single']:.2f} vs {row['cpp']:.2f} "
                              f"(x{row['speedup']:.2f})")
    for row in data.get("capacity_sweep", []):
        capacity = "infinite" if row["capacity_tokens"] is None else f"{row['capacity_tokens']:,}"
        table.caption += f"\n{capacity} tokens of cache: hit rate {row['hit_rate']:.1%}"
    return table


def register(root: typer.Typer) -> None:
    root.command("sim")(settings_options("scheduler", "prefill_chunk")(sim))


__all__ = ["register", "sim"]
