"""`mooncake bench serve --hosts N`: a cluster over network namespaces, once per policy, cleaned up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import psutil
import pytest

from transfer.rpc.spin import usable_cores
from daemons.serving.figure5 import (DECISIONS, cost_figures, parse_metrics, policy_summary, reuse_ceiling,
                                    simulate_policy)
from scheduler.config import SchedulerConfig
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
    # The simulator's prediction for the same slice, priced with what the live conductor used.
    assert data["costs"]["kv_bytes_per_token"] == 2048
    # Priced twice: every instance on this machine's cores (as the hosts are), one compute each.
    assert data["sim_cores"] == usable_cores()
    for sim in (row["sim"], row["sim_dedicated"]):
        assert set(sim["ttft"]) == DISTRIBUTION and sum(sim["decisions"].values()) + sim["rejected"] == 8
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
