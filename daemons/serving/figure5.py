"""What `mooncake bench serve --hosts N` reports per policy (the live Figure 5), and the simulator's
prediction for the same slice and cluster. Pure: it reads completions, `/metrics` text and cost
figures, and runs the simulator in process.

Per policy: ``ttft`` and ``tbt`` (mean, p50, p90, p99, seconds, as the client saw them), the token
``hit_rate``, the conductor's ``decisions`` (local_hit / transfer / recompute / miss, from each
completion's ``mooncake.reason``), ``replicas`` (``mooncake_replicated_blocks_total``; None while
the conductor does not count them), ``rejected`` (and ``rejected_by`` reason) and ``failed``. Every replayed request is counted
exactly once: in a decision, in ``rejected`` or in ``failed``. ``ttft_parts``: where the mean TTFT
went (:data:`TTFT_PARTS`), so that the live and the simulated TTFT compare part by part.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from scheduler.config import SchedulerConfig
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import SimSetup, simulate
from scheduler.sim.trace import TraceRequest
from scheduler.types import LOCAL_HIT, MISS, RECOMPUTE, TRANSFER

DECISIONS = (LOCAL_HIT, TRANSFER, RECOMPUTE, MISS)
# Mean seconds of a request's TTFT in each part: waiting in its prefill worker's queue, loading
# its prefix (a pull included), computing, handing the last layer's KV to decode (as the prefill
# worker timed them); the conductor's own share of its TTFT besides (``dispatch``: scheduling,
# decode.reserve, prefill.run until the job is queued, the report's way back); and the client's
# beyond the conductor's (``frontend``: HTTP both ways, decode.start before the first token goes
# out). The simulator has the first three only.
TTFT_PARTS = ("queue", "load", "compute", "handoff", "dispatch", "frontend")
ERROR_CHARS = 160
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def distribution(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(np.asarray(values), [50, 90, 99])
    return {"mean": float(np.mean(values)), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample in a Prometheus exposition text."""
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match:
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def cost_figures(metrics: dict[str, float]) -> dict[str, Any] | None:
    """The conductor's cost figures from its ``mooncake_cost_*`` gauges; None if it shows none."""
    if "mooncake_cost_kv_bytes_per_token" not in metrics:
        return None
    def terms(name: str, labels: tuple[str, ...]) -> list[float]:
        return [metrics[f'{name}{{term="{term}"}}'] for term in labels]

    return {"kv_bytes_per_token": int(metrics["mooncake_cost_kv_bytes_per_token"]),
            "transfer_bandwidth": metrics["mooncake_cost_transfer_bandwidth_bytes"],
            "prefill_coef": terms("mooncake_cost_prefill_seconds", ("fixed", "per_token", "per_token_pair")),
            "tbt_coef": terms("mooncake_cost_tbt_seconds", ("fixed", "per_sequence", "per_context_token"))}


def policy_summary(outcomes: list[dict], metrics: dict[str, float], seconds: float) -> dict[str, Any]:
    """One policy's row from the driver's per-request ``outcomes`` (each ``{"ok", "ttft", "gaps",
    "prompt_tokens", "mooncake"}`` or ``{"ok": False, "rejected": bool}``) and its `/metrics`."""
    done = [o for o in outcomes if o["ok"]]
    reasons = Counter(o["mooncake"].get("reason") for o in done)
    prompt = sum(o["prompt_tokens"] for o in done)
    replicas = metrics.get("mooncake_replicated_blocks_total")
    return {
        "requests": len(outcomes), "completed": len(done),
        "rejected": sum(not o["ok"] and o["rejected"] for o in outcomes),
        "rejected_by": dict(Counter(o["reason"] for o in outcomes if not o["ok"] and o["rejected"])),
        "failed": sum(not o["ok"] and not o["rejected"] for o in outcomes),
        # What failed requests were told, most common first (a few lines, not one per request).
        "errors": Counter(o.get("error", "")[:ERROR_CHARS] for o in outcomes
                          if not o["ok"] and not o["rejected"]).most_common(3),
        "ttft": distribution([o["ttft"] for o in done if o["ttft"] is not None]),
        "ttft_parts": ttft_parts(done),
        "tbt": distribution([g for o in done for g in o["gaps"]]),
        "hit_rate": sum(o["mooncake"].get("prefix_tokens", 0) for o in done) / prompt if prompt else 0.0,
        "decisions": {reason: reasons[reason] for reason in DECISIONS},
        "other_decisions": sum(n for reason, n in reasons.items() if reason not in DECISIONS),
        "replicas": None if replicas is None else int(replicas),
        "seconds": seconds,
    }


def ttft_parts(done: list[dict]) -> dict[str, float | None]:
    """Mean seconds per part of the TTFT (:data:`TTFT_PARTS`) over the completed requests that
    carry the prefill worker's timings; every part None without one."""
    timed = [(o["ttft"], o["mooncake"]["ttft_s"], o["mooncake"]["timings"]) for o in done
             if o["ttft"] is not None and o["mooncake"].get("timings") and o["mooncake"].get("ttft_s") is not None]
    if not timed:
        return dict.fromkeys(TTFT_PARTS)
    parts = [(t["queue"], t["load"], t["compute"], t["transfer"]) for _, _, t in timed]
    rows = [(*p, conductor - sum(p), client - conductor) for (client, conductor, _), p in zip(timed, parts)]
    return {name: float(np.mean(column)) for name, column in zip(TTFT_PARTS, zip(*rows))}


def sim_requests(slice_: list[TraceRequest], prompts: list[list[int]], max_blocks: int,
                 max_tokens: list[int]) -> list[TraceRequest]:
    """The replayed requests as the simulator sees them: each prompt's real length and output,
    and the trace blocks it kept (one per KV block of the cluster)."""
    return [TraceRequest(request.arrival, len(tokens), out, request.hash_ids[:max_blocks])
            for request, tokens, out in zip(slice_, prompts, max_tokens)]


def reuse_ceiling(requests: list[TraceRequest]) -> float:
    """Share of the slice's prompt blocks that a cache holding everything seen before would
    serve (leading blocks only, as prefix reuse works): the most any policy can hit. Where this
    is small, the policies cannot differ much whatever they do."""
    seen: set[int] = set()
    hit = total = 0
    for request in requests:
        total += len(request.hash_ids)
        for block in request.hash_ids:
            if block not in seen:
                break
            hit += 1
        seen.update(request.hash_ids)
    return hit / total if total else 0.0


def average_costs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' costs averaged term by term. The time models are linear in their terms, so the
    averaged model predicts, for every prompt, the mean of what the runs' models predict.

    Each run's refitted costs include what that run's own load did to them (on shared cores, a
    policy that computes more makes every prefill slower, and so does whatever else ran), so
    simulating every policy with its own run's costs repeats the runs' conditions; with one set
    of costs for all, the simulator's rows differ only by what it simulates of the policies."""
    def mean(name: str) -> list[float]:
        return [float(np.mean(terms)) for terms in zip(*(run[name] for run in runs))]

    return {"kv_bytes_per_token": runs[0]["kv_bytes_per_token"],
            "transfer_bandwidth": float(np.mean([run["transfer_bandwidth"] for run in runs])),
            "prefill_coef": mean("prefill_coef"), "tbt_coef": mean("tbt_coef")}


def _cost_model(costs: dict[str, Any], decode_kv_tokens: int) -> CostModel:
    return CostModel(bytes_per_token=costs["kv_bytes_per_token"], bandwidth=costs["transfer_bandwidth"],
                     prefill=PrefillTimeModel(tuple(costs["prefill_coef"])),
                     decode=DecodeTbtModel(tuple(costs["tbt_coef"])), decode_kv_capacity=decode_kv_tokens)


def simulate_policy(requests: list[TraceRequest], cfg: SchedulerConfig, num_prefill: int,
                    costs: dict[str, Any], cache_tokens: int, decode_kv_tokens: int,
                    shared_cores: int | None = None, planned_with: dict[str, Any] | None = None) -> dict[str, Any]:
    """The simulator's prediction of one policy on ``num_prefill`` prefill instances and one
    decode instance, priced with a live run's costs: ``costs``, what its conductor planned with
    at the end (its workers' start-up profiles refitted by what they served), are what things
    cost; its conductor starts from ``planned_with`` (the profiles, before the first request)
    and learns the rest as the live one did (None: it knows ``costs`` from the start). Transfers
    are planned at those costs' bytes per token and bandwidth, as live, not at the configured
    ones. Every instance computes on ``shared_cores`` cores together, or (None) each on compute
    of its own."""
    start = planned_with or costs
    cfg = cfg.with_(bytes_per_token=start["kv_bytes_per_token"], bandwidth=start["transfer_bandwidth"])
    cost = _cost_model(costs, decode_kv_tokens)
    planned = _cost_model(planned_with, decode_kv_tokens) if planned_with else None
    result = simulate(requests, cfg, SimSetup(num_prefill, 1, cache_tokens, 0, cost, shared_cores=shared_cores,
                                              planned_with=planned))
    decisions = {reason: result.reasons[reason] for reason in DECISIONS}
    done = len(result.ttft)
    queue = float(np.mean(result.queue_seconds)) if done else None
    load = result.transfer_seconds / done if done else None
    return {"ttft": distribution(result.ttft), "tbt": distribution(result.tbt), "hit_rate": result.hit_rate,
            "decisions": decisions, "rejected": result.rejected,
            "transferred_tokens": result.transferred_tokens, "queue_seconds": distribution(result.queue_seconds),
            # Comparable with the live row's: the simulator has no hand-off, dispatch nor front end.
            "ttft_parts": {"queue": queue, "load": load,
                           "compute": float(np.mean(result.ttft)) - queue - load if done else None,
                           **dict.fromkeys(("handoff", "dispatch", "frontend"), 0.0 if done else None)}}
