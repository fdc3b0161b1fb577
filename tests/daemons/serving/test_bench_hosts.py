"""`mooncake bench serve --hosts N`: a cluster over network namespaces, once per policy, cleaned up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import psutil
import pytest

from transfer.rpc.spin import usable_cores
from daemons.serving import bench_hosts
from daemons.serving.figure5 import (DECISIONS, TTFT_PARTS, average_costs, cost_figures, parse_metrics,
                                    policy_summary, reuse_ceiling, simulate_policy)
from scheduler.config import SchedulerConfig
from scheduler.predictors import PrefillTimeModel
from scheduler.sim.trace import TraceRequest

DISTRIBUTION = {"mean", "p50", "p90", "p99"}


def _namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                    reason="needs root, ip and tc: creates network namespaces")
def test_two_hosts_replay_a_tiny_slice_and_leave_nothing_behind(mooncake):
    before = _namespaces()
    result = mooncake("bench", "serve", "--hosts", "2", "--requests", "8", "--policy", "kvcentric",
                      "--link-gbps", "1", "--json", timeout=280)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    data = json.loads(result.stdout)
    assert data["hosts"] == 2 and data["requests"] == 8 and data["namespaces_left"] == []
    assert 0 <= data["reuse_ceiling"] <= 1
    row = data["policies"]["kvcentric"]
    assert set(row["ttft"]) == set(row["tbt"]) == DISTRIBUTION
    assert set(row["decisions"]) == set(DECISIONS)
    # Every request is counted once: a decision, a rejection or a failure.
    decided = sum(row["decisions"].values()) + row["other_decisions"]
    assert decided == row["completed"] and decided + row["rejected"] + row["failed"] == 8
    assert row["completed"] > 0 and row["ttft"]["mean"] > 0
    # Untimed warm-up first, two requests per host, outside every figure of the row.
    assert row["warmup"] == {"requests": 4, "completed": 4}
    assert set(row["ttft_parts"]) == set(TTFT_PARTS)
    # The costs the live conductor planned with: from the start-up profiles, then refitted from
    # what it served; the simulator's prediction for the same slice is priced with them.
    assert row["costs_profiled"]["kv_bytes_per_token"] == row["costs_refitted"]["kv_bytes_per_token"] == 2048
    # Priced twice: every instance on this machine's cores (as the hosts are), one compute each.
    assert data["sim_cores"] == usable_cores()
    assert data["averaged_costs"]["kv_bytes_per_token"] == 2048
    for sim in (row["sim"], row["sim_dedicated"], row["sim_averaged"]):
        assert set(sim["ttft"]) == DISTRIBUTION and sum(sim["decisions"].values()) + sim["rejected"] == 8
        assert set(sim["ttft_parts"]) == set(TTFT_PARTS)
    # Nothing left: no namespace of ours, no daemon of ours.
    assert not {ns for ns in _namespaces() - before if ns.startswith("mcb")}
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"])
                 if any("mooncake-bench-hosts-" in part for part in p.info["cmdline"] or [])]
    assert not leftovers


def test_without_ip_it_says_so_in_one_line(mooncake):
    result = mooncake("bench", "serve", "--hosts", "2", env={"PATH": "/nonexistent"})
    assert result.returncode != 0
    message = result.stderr.decode().strip()
    assert len(message.splitlines()) == 1 and ("`ip`" in message or "root" in message)


def test_the_summary_counts_every_request_once():
    metrics = parse_metrics('mooncake_replicated_blocks_total 3\nmooncake_cost_kv_bytes_per_token 2048\n'
                            'mooncake_cost_transfer_bandwidth_bytes 1.25e+08\n'
                            + "".join(f'mooncake_cost_prefill_seconds{{term="{t}"}} 0.001\n'
                                      for t in ("fixed", "per_token", "per_token_pair"))
                            + "".join(f'mooncake_cost_tbt_seconds{{term="{t}"}} 0.002\n'
                                      for t in ("fixed", "per_sequence", "per_context_token")))
    done = lambda reason, prefix: {"ok": True, "ttft": 0.1, "gaps": [0.01, 0.02], "prompt_tokens": 100,  # noqa: E731
                                   "mooncake": {"reason": reason, "prefix_tokens": prefix}}
    outcomes = [done("miss", 0), done("transfer", 64), done("local_hit", 96),
                {"ok": False, "rejected": True, "reason": "reject_tbt"}, {"ok": False, "rejected": False}]
    row = policy_summary(outcomes, metrics, 2.0)
    assert row["decisions"] == {"local_hit": 1, "transfer": 1, "recompute": 0, "miss": 1}
    assert (row["completed"], row["rejected"], row["failed"], row["replicas"]) == (3, 1, 1, 3)
    assert row["rejected_by"] == {"reject_tbt": 1}
    assert row["hit_rate"] == pytest.approx(160 / 300) and row["ttft"]["p50"] == pytest.approx(0.1)
    assert cost_figures(metrics) == {"kv_bytes_per_token": 2048, "transfer_bandwidth": 1.25e8,
                                     "prefill_coef": [0.001] * 3, "tbt_coef": [0.002] * 3}
    assert policy_summary([], {}, 0.0)["replicas"] is None  # not counted by this conductor


def test_the_reuse_ceiling_counts_leading_blocks_seen_before():
    requests = [TraceRequest(0.0, 96, 1, (1, 2, 3)), TraceRequest(1.0, 96, 1, (1, 2, 4)),
                TraceRequest(2.0, 96, 1, (5, 2, 3))]  # the last shares blocks, but not its first
    assert reuse_ceiling(requests) == 2 / 9


def test_the_simulator_prices_instances_that_share_the_machines_cores():
    # Two fresh prompts of 1 s each at once, one per prefill instance: on one shared core each
    # takes twice its work; with a compute each (or two cores), its work.
    costs = {"kv_bytes_per_token": 2048, "transfer_bandwidth": 1e8, "prefill_coef": [0.0, 1e-3, 0.0],
             "tbt_coef": [0.01, 0.0, 0.0]}
    requests = [TraceRequest(0.0, 1000, 1, (1,)), TraceRequest(0.0, 1000, 1, (2,))]
    cfg = SchedulerConfig(block_tokens=512, ttft_slo=0.0, tbt_slo=0.0, admission="none", policy="load")
    ttft = {cores: simulate_policy(requests, cfg, 2, costs, 10_000, 10_000, shared_cores=cores)["ttft"]["mean"]
            for cores in (None, 1, 2)}
    assert ttft == pytest.approx({None: 1.0, 1: 2.0, 2: 1.0})
    assert usable_cores() >= 1


def test_ttft_parts_split_the_mean_ttft_as_the_prefill_worker_timed_it():
    timed = lambda ttft, conductor, queue, load, compute, handoff: {  # noqa: E731
        "ok": True, "ttft": ttft, "gaps": [], "prompt_tokens": 64,
        "mooncake": {"reason": "miss", "ttft_s": conductor,
                     "timings": {"queue": queue, "load": load, "compute": compute, "store": 0.5, "transfer": handoff}}}
    row = policy_summary([timed(0.2, 0.19, 0.05, 0.01, 0.1, 0.02), timed(0.4, 0.37, 0.15, 0.03, 0.1, 0.04)], {}, 1.0)
    # The store's puts end after the report, off the TTFT: they are in no part. What the
    # conductor timed beyond the worker's parts is its dispatch; what the client saw beyond the
    # conductor's TTFT, the front end.
    assert row["ttft_parts"] == pytest.approx({"queue": 0.1, "load": 0.02, "compute": 0.1, "handoff": 0.03,
                                               "dispatch": 0.03, "frontend": 0.02})
    assert sum(row["ttft_parts"].values()) == pytest.approx(row["ttft"]["mean"])
    assert set(policy_summary([], {}, 0.0)["ttft_parts"].values()) == {None}


SHARED_PREFIX = [TraceRequest(0.5 * i, 512, 1, (1, 2, 3, 10 + i)) for i in range(6)]


def test_the_simulated_conductor_plans_pulls_with_the_runs_costs():
    # Pulls at 1 kB/s of 2 KiB per token: no prefix is worth pulling. Planned at the configured
    # 320 KiB per token over 12.5 GB/s instead, the busy holder's prefix would be pulled.
    costs = {"kv_bytes_per_token": 2048, "transfer_bandwidth": 1e3, "prefill_coef": [0.0, 2e-3, 0.0],
             "tbt_coef": [0.01, 0.0, 0.0]}
    cfg = SchedulerConfig(block_tokens=128, ttft_slo=0.0, tbt_slo=0.0, admission="none")
    sim = simulate_policy(SHARED_PREFIX, cfg, 2, costs, 10_000, 10_000)
    assert sim["decisions"]["transfer"] == 0
    fast = simulate_policy(SHARED_PREFIX, cfg, 2, {**costs, "transfer_bandwidth": 1e9}, 10_000, 10_000)
    assert fast["decisions"]["transfer"] > 0


def test_the_simulators_ttft_parts_add_up_to_its_mean_ttft():
    costs = {"kv_bytes_per_token": 2048, "transfer_bandwidth": 1e8, "prefill_coef": [0.001, 2e-3, 0.0],
             "tbt_coef": [0.01, 0.0, 0.0]}
    cfg = SchedulerConfig(block_tokens=128, ttft_slo=0.0, tbt_slo=0.0, admission="none")
    sim = simulate_policy(SHARED_PREFIX, cfg, 2, costs, 10_000, 10_000, shared_cores=1)
    parts = sim["ttft_parts"]
    assert parts["handoff"] == parts["dispatch"] == parts["frontend"] == 0.0 and parts["queue"] == pytest.approx(sim["queue_seconds"]["mean"])
    assert sum(parts.values()) == pytest.approx(sim["ttft"]["mean"])


def _conversations(count: int, turns: int, gap: float) -> list[TraceRequest]:
    """``count`` conversations of ``turns`` turns each, interleaved: every turn repeats its
    conversation's blocks so far and adds two."""
    requests = []
    for turn in range(turns):
        for c in range(count):
            blocks = tuple(1000 * c + b for b in range(2 * turn + 2))
            requests.append(TraceRequest((turn * count + c) * gap, 64 * len(blocks), 4, blocks))
    return requests


def test_the_simulator_orders_the_policies_as_a_planner_that_knew_the_served_costs():
    # A live conductor plans from its workers' start-up profile (a bare forward pass, here 3x
    # too cheap) and refits from what they serve; the simulator starts from the same profile and
    # learns the same way. On a slice with reuse that must not change which policy is better.
    served = {"kv_bytes_per_token": 2048, "transfer_bandwidth": 5e7, "prefill_coef": [0.01, 1e-4, 2e-7],
              "tbt_coef": [0.002, 1e-4, 1e-7]}
    profiled = {**served, "prefill_coef": [0.001, 3.3e-5, 7e-8]}
    requests = _conversations(count=5, turns=6, gap=0.03)
    cfg = SchedulerConfig(block_tokens=64, ttft_slo=0.0, tbt_slo=0.0, admission="none")

    def mean_ttft(planned_with):
        return {policy: simulate_policy(requests, cfg.with_(policy=policy), 3, served, 100_000, 100_000,
                                        shared_cores=2, planned_with=planned_with)["ttft"]["mean"]
                for policy in ("random", "load", "cache", "kvcentric")}

    learning, knowing = mean_ttft(profiled), mean_ttft(None)
    assert sorted(learning, key=learning.get) == sorted(knowing, key=knowing.get)
    # And reuse pays on this slice: the cache-aware policies lead.
    assert max(learning["cache"], learning["kvcentric"]) < min(learning["random"], learning["load"])


def test_workers_start_one_at_a_time_in_host_order(tmp_path, monkeypatch):
    # Each worker profiles its costs as it starts; profiles that overlap on this machine's few
    # cores time each other's work. So a worker is started only once the one before announced
    # itself, which it does after its profile.
    events = []
    monkeypatch.setattr(bench_hosts.Cluster, "spawn",
                        lambda self, role, name, prefix, **kw: events.append(("start", name)))
    monkeypatch.setattr(bench_hosts, "_announced",
                        lambda cluster, name, field, timeout: events.append(("ready", name)) or "10.78.0.1:1")
    bench_hosts.start_cluster(bench_hosts.Hosts(3), tmp_path, {}, timeout=1.0)
    workers = [e for e in events if e[1].startswith(("prefill", "decode"))]
    assert workers == [(step, name) for name in ("prefill-host1", "prefill-host2", "prefill-host3", "decode")
                       for step in ("start", "ready")]


def test_averaged_costs_predict_the_mean_of_the_runs_predictions():
    runs = [{"kv_bytes_per_token": 2048, "transfer_bandwidth": 1e8, "prefill_coef": [0.02, 1e-4, 0.0],
             "tbt_coef": [0.001, 0.0, 1e-6]},
            {"kv_bytes_per_token": 2048, "transfer_bandwidth": 3e8, "prefill_coef": [0.01, 3e-5, 2e-7],
             "tbt_coef": [0.003, 2e-4, 0.0]}]
    averaged = average_costs(runs)
    assert averaged["kv_bytes_per_token"] == 2048 and averaged["transfer_bandwidth"] == pytest.approx(2e8)
    assert averaged["prefill_coef"] == pytest.approx([0.015, 6.5e-5, 1e-7])
    assert averaged["tbt_coef"] == pytest.approx([0.002, 1e-4, 5e-7])
    predict = lambda costs: PrefillTimeModel(tuple(costs["prefill_coef"])).predict(700, 128)  # noqa: E731
    assert predict(averaged) == pytest.approx((predict(runs[0]) + predict(runs[1])) / 2)
