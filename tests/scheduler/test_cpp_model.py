"""The CPP group's prefill time model, and the conductor planning a group with it."""

import pytest

from scheduler.conductor import PREFILL_REFIT, Conductor
from scheduler.config import SchedulerConfig
from scheduler.cpp import CppPrefillTimeModel, ttft_curve
from scheduler.predictors import PrefillTimeModel
from scheduler.types import ScheduleRequest

LINEAR = PrefillTimeModel((0.0, 1e-3, 0.0))  # 1 ms per new token, no attention term


def test_short_prompts_cost_what_one_worker_costs():
    group = CppPrefillTimeModel(LINEAR, stages=2, chunk=100)
    assert group.predict(100, 0) == LINEAR.predict(100, 0)


def test_pipeline_fills_then_overlaps():
    # 4 chunks of 100 tokens over 2 stages: 0.05 s per chunk per stage, stage 1 lags by one
    # chunk and a 0.01 s hop: 4 * 0.05 + 0.05 + 0.01 = 0.26 s instead of 0.4 s on one worker.
    group = CppPrefillTimeModel(LINEAR, stages=2, chunk=100, hop=0.01)
    assert group.predict(400, 0) == pytest.approx(0.26)
    assert group.predict(500, 100) == pytest.approx(0.26)  # only the new tokens are chunked
    rows = ttft_curve(LINEAR, group, [100, 400])
    assert [round(r["speedup"], 3) for r in rows] == [1.0, round(0.4 / 0.26, 3)]


def test_conductor_plans_a_group_with_its_own_model():
    conductor = Conductor(SchedulerConfig(block_tokens=100), prefill_model=LINEAR)
    conductor.add_prefill("single")
    conductor.add_prefill("group", CppPrefillTimeModel(LINEAR, stages=4, chunk=100))
    conductor.add_decode("D", kv_capacity_tokens=100_000)
    decision = conductor.schedule(ScheduleRequest("long", [], 800), 0.0)
    assert decision.prefill_id == "group"
    assert decision.candidates["single"] == pytest.approx(0.8)
    assert decision.candidates["group"] == pytest.approx(0.275)  # 8 chunks of 25 ms, then 3 to drain


def test_a_groups_pipelined_timings_stay_out_of_the_single_worker_model():
    conductor = Conductor(SchedulerConfig(block_tokens=100), prefill_model=LINEAR)
    group = CppPrefillTimeModel(LINEAR, stages=2, chunk=100)
    conductor.add_prefill("single")
    conductor.add_prefill("group", group)
    truth = PrefillTimeModel((0.01, 2e-4, 1e-8))
    fed = []
    for i in range(PREFILL_REFIT + 10):
        n, long = 20 + i, 200 + 7 * i
        # The group pipelines prompts over 100 new tokens in half the time: not one worker's curve.
        fed.append(conductor.observe_prefill(long, 0, truth.predict(long, 0) / 2, "group"))
        fed.append(conductor.observe_prefill(n, 0, truth.predict(n, 0), "group" if i % 2 else "single"))
    # Refits after 8, 16, 32 and 64 of the single worker's samples, none of the group's long ones.
    assert fed.count(True) == 4
    assert conductor.prefill_model.coef == pytest.approx(truth.coef, rel=1e-6)
    assert group.single is conductor.prefill_model  # the group plans on the refitted worker
