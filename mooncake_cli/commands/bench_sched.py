"""`mooncake bench sched`: how long one conductor decision takes.

A conductor with N prefill and M decode instances and a populated cache index (prefix families
spread over the instances, hot ones replicated) schedules prompts of a fixed number of blocks;
each decision is timed alone. The request then runs its lifecycle untimed, so queues and the
decode forecast stay at a steady size instead of growing with the iteration count.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit

if TYPE_CHECKING:
    from scheduler.conductor import Conductor

GOAL_P99_US = 200.0


def _populate(conductor: Conductor, prefill_ids: list[str], families: int, blocks: int,
              rng: random.Random) -> list[list[int]]:
    chains = []
    for family in range(families):
        chain = [family * 1_000_000 + b for b in range(blocks)]
        chains.append(chain)
        for holder in rng.sample(prefill_ids, k=rng.randint(1, 3)):
            conductor.blocks_stored(holder, chain[:rng.randint(1, blocks)])
    return chains


def sched(
    iterations: int = typer.Option(5000, min=100, help="Decisions to time."),
    prefill: int = typer.Option(32, "--prefill", min=1, help="Prefill instances."),
    decode: int = typer.Option(32, "--decode", min=1, help="Decode instances."),
    blocks: int = typer.Option(40, "--blocks", min=1, help="Blocks per prompt."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Conductor decision time (Algorithm 1 plus admission) at cluster scale; goal p99 < 200 us."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    import numpy as np

    from scheduler.conductor import Conductor
    from scheduler.config import SchedulerConfig
    from scheduler.types import ScheduleRequest

    cfg = SchedulerConfig.from_config(config)
    rng = random.Random(0)
    conductor = Conductor(cfg)
    prefill_ids = [f"prefill-{i}" for i in range(prefill)]
    for name in prefill_ids:
        conductor.add_prefill(name)
    for i in range(decode):
        conductor.add_decode(f"decode-{i}", config.decode_kv_capacity_tokens)
    chains = _populate(conductor, prefill_ids, 256, blocks, rng)
    block_tokens = cfg.block_tokens
    samples = np.empty(iterations)
    now, inflight = 0.0, []
    for i in range(iterations):
        chain = chains[rng.randrange(len(chains))]
        shared = rng.randint(0, blocks)  # a prompt shares some prefix, then diverges
        keys = chain[:shared] + [-(i * blocks + b) - 1 for b in range(blocks - shared)]
        request = ScheduleRequest(str(i), keys, blocks * block_tokens, 300)
        started = time.perf_counter_ns()
        decision = conductor.schedule(request, now)
        samples[i] = (time.perf_counter_ns() - started) / 1000.0
        now += 0.05
        if decision.accepted:
            inflight.append(request.request_id)
        while len(inflight) > 4 * decode:  # retire the oldest untimed: steady state
            rid = inflight.pop(0)
            conductor.prefill_finished(rid, now)
            if conductor.admit_decode(rid, now) is not None:
                conductor.decode_finished(rid, now)
    p50, p99 = np.percentile(samples, [50, 99])
    data = {"prefill": prefill, "decode": decode, "blocks": blocks, "iterations": iterations,
            "policy": cfg.policy, "admission": cfg.admission, "p50_us": float(p50),
            "p99_us": float(p99), "mean_us": float(samples.mean()), "goal_p99_us": GOAL_P99_US,
            "meets_goal": bool(p99 < GOAL_P99_US)}

    def render(data: dict) -> Table:
        table = Table("instances", "blocks", "policy/admission", "p50 us", "p99 us", "goal p99 us",
                      title="conductor decision time")
        table.add_row(f"{data['prefill']}P+{data['decode']}D", str(data["blocks"]),
                      f"{data['policy']}/{data['admission']}", f"{data['p50_us']:.1f}",
                      f"{data['p99_us']:.1f}", f"{data['goal_p99_us']:.0f}"
                      + (" ok" if data["meets_goal"] else " MISSED"))
        return table

    emit(data, json_output, render)


sched = settings_options("scheduler")(sched)

__all__ = ["sched"]
