"""Processor sharing of the simulator's shared cores, checked against times computed by hand,
and the engine's default (one compute per instance) checked against its results before sharing
existed."""

import random

import pytest

from scheduler.config import POLICIES, SchedulerConfig
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel
from scheduler.sim.cores import SharedCores
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import SimSetup, simulate
from scheduler.sim.trace import TraceRequest


def finish_times(cores: int, jobs: list[tuple[float, str, float]]) -> dict[str, float]:
    """Drive SharedCores as the engine does: ``jobs`` are (start, id, work), by start."""
    shared, pending, finished = SharedCores(cores), list(jobs), {}
    while pending or shared.marks:
        at = shared.next_finish(shared.updated)
        if pending and (at is None or pending[0][0] <= at):
            start, task, work = pending.pop(0)
            shared.join(task, work, start)
        else:
            finished.update((task, at) for task in shared.pop_finished(at))
    return finished


def test_one_job_alone_takes_its_work():
    assert finish_times(2, [(1.0, "a", 3.0)]) == pytest.approx({"a": 4.0})


def test_two_jobs_on_one_core_each_take_twice_as_long():
    assert finish_times(1, [(0.0, "a", 1.0), (0.0, "b", 1.0)]) == pytest.approx({"a": 2.0, "b": 2.0})


def test_two_jobs_on_two_cores_each_take_their_work():
    assert finish_times(2, [(0.0, "a", 1.0), (0.0, "b", 1.0)]) == pytest.approx({"a": 1.0, "b": 1.0})


def test_a_job_that_starts_while_another_runs_re_times_the_first():
    # One core. a alone until 1 (1 of its 2 s done), then a and b at half speed: b's 0.5 s end
    # at 2, when a has 0.5 s left, which it does alone by 2.5.
    assert finish_times(1, [(0.0, "a", 2.0), (1.0, "b", 0.5)]) == pytest.approx({"a": 2.5, "b": 2.0})
    # Three jobs on two cores: at 1, a has 1 s left and the three run at 2/3: b (0.4 s) ends at
    # 1.6, then a (0.6 left) and c (1.6 left) each have a core: a at 2.2, c at 3.2.
    assert finish_times(2, [(0.0, "a", 2.0), (1.0, "b", 0.4), (1.0, "c", 2.0)]) == pytest.approx(
        {"a": 2.2, "b": 1.6, "c": 3.2})


def test_a_task_without_an_end_takes_its_share_until_it_stops():
    shared = SharedCores(1)
    shared.set_endless("decode", True, 0.0)
    shared.join("a", 1.0, 0.0)
    assert shared.next_finish(0.0) == pytest.approx(2.0)  # half a core
    version = shared.version
    shared.set_endless("decode", False, 1.0)  # a has 0.5 s left, now with the core to itself
    assert shared.version > version and shared.next_finish(1.0) == pytest.approx(1.5)
    assert shared.pop_finished(1.5) == ["a"]


@pytest.mark.parametrize("cores", [1, 2, 3])
def test_the_cores_do_the_jobs_total_work_while_busy(cores):
    rng = random.Random(cores)
    starts = sorted(rng.uniform(0.0, 5.0) for _ in range(12))
    jobs = [(start, f"j{i}", rng.uniform(0.1, 2.0)) for i, start in enumerate(starts)]
    finished = finish_times(cores, jobs)
    # Between two consecutive starts or finishes k jobs compute, doing min(k, cores) s of work a second.
    edges = sorted([(start, +1) for start, _, _ in jobs] + [(at, -1) for at in finished.values()])
    done, running = 0.0, 0
    for (at, change), (following, _) in zip(edges, edges[1:]):
        running += change
        done += min(running, cores) * (following - at)
    assert done == pytest.approx(sum(work for _, _, work in jobs))
    assert all(finished[task] >= start + work - 1e-9 for start, task, work in jobs)


def test_fewer_cores_than_one_is_refused():
    with pytest.raises(ValueError):
        SharedCores(0)


# -- the engine -------------------------------------------------------------------------------

# Prefill 1 ms per new token, decode 10 ms per step whatever the batch; blocks of 512 tokens.
COST = CostModel(bytes_per_token=1, bandwidth=20480.0, link_latency=0.001,
                 prefill=PrefillTimeModel((0.0, 1e-3, 0.0)), decode=DecodeTbtModel((0.01, 0.0, 0.0)))
CFG = SchedulerConfig(block_tokens=512, ttft_slo=0.0, tbt_slo=0.0, admission="none", bytes_per_token=1,
                      bandwidth=20480.0, policy="load")
TWO_AT_ONCE = [TraceRequest(0.0, 1000, 1, (1,)), TraceRequest(0.0, 1000, 1, (2,))]


@pytest.mark.parametrize("cores, ttft", [(None, 1.0), (2, 1.0), (1, 2.0)])
def test_two_prefill_instances_on_shared_cores(cores, ttft):
    result = simulate(TWO_AT_ONCE, CFG, SimSetup(num_prefill=2, num_decode=1, cost=COST, shared_cores=cores))
    assert result.ttft == pytest.approx([ttft, ttft])
    assert result.prefill_compute_seconds == pytest.approx(2.0)  # work, whatever the sharing


def test_decode_steps_take_a_share_of_the_cores():
    # One core. r0 prefills alone (0 -> 1) and decodes 100 steps of 10 ms from 1. r1's prefill
    # (0.5 s) from 1 shares the core with that batch: it ends at 2, when r0 has 50 tokens; then
    # the batch of two has the core: r0 ends at 2.5, r1 (100 steps) at 3.
    trace = [TraceRequest(0.0, 1000, 100, (1,)), TraceRequest(1.0, 500, 100, (2,))]
    result = simulate(trace, CFG, SimSetup(num_prefill=2, num_decode=1, cost=COST, shared_cores=1))
    assert result.ttft == pytest.approx([1.0, 1.0])
    assert sorted(result.tbt) == pytest.approx([0.01, 1.5 / 100])
    assert result.sim_seconds == pytest.approx(3.0)


def conversations(seed: int = 7, num: int = 60) -> list[TraceRequest]:
    """Six conversations whose turns each add one to three blocks to their history."""
    rng = random.Random(seed)
    histories, requests, now = {}, [], 0.0
    for _ in range(num):
        now += rng.expovariate(8.0)
        conversation = rng.randrange(6)
        history = histories.get(conversation, (0, 1000 * conversation))
        history += tuple(rng.randrange(10**6) for _ in range(rng.randint(1, 3)))
        histories[conversation] = history
        requests.append(TraceRequest(now, 64 * len(history) - rng.randrange(64), rng.randint(1, 16), history))
    return requests


# The live bench's costs (run C of issue 18), a cache of 40 blocks per instance: evictions,
# transfers, queues. Sums of TTFT and TBT per policy as the engine gave them before it had shared
# cores (commit 58608d7).
BENCH_COST = CostModel(bytes_per_token=2048, bandwidth=56e6, prefill=PrefillTimeModel((0.0451, 6.23e-5, 5.42e-7)),
                       decode=DecodeTbtModel((0.00628, 0.0, 5.46e-6)), decode_kv_capacity=32768)
BEFORE_SHARING = {"random": (36.065058597136144, 0.7932483393756886), "load": (25.19050437637558, 0.8262707956568273),
                  "cache": (12.482872277230921, 0.8535162055643908), "kvcentric": (12.84520076409586, 0.8558837576168951)}


@pytest.mark.parametrize("policy", POLICIES)
def test_one_compute_per_instance_gives_what_it_gave_before_shared_cores(policy):
    cfg = SchedulerConfig(block_tokens=64, ttft_slo=0.0, tbt_slo=0.0, admission="none", bytes_per_token=2048,
                          bandwidth=56e6, policy=policy)
    trace = conversations()
    dedicated = simulate(trace, cfg, SimSetup(3, 1, 64 * 40, 0, BENCH_COST))
    assert (sum(dedicated.ttft), sum(dedicated.tbt)) == BEFORE_SHARING[policy]
    # Cores for every task (3 prefill + 1 decode): sharing never slows anyone.
    enough = simulate(trace, cfg, SimSetup(3, 1, 64 * 40, 0, BENCH_COST, shared_cores=4))
    assert enough.ttft == pytest.approx(dedicated.ttft) and enough.tbt == pytest.approx(dedicated.tbt)
