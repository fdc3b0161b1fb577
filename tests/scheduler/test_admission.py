"""Early rejection versus prediction-based early rejection on a scripted arrival sequence.

One prefill instance takes 1 s per request; one decode instance keeps TBT = 10 ms x batch within
a 35 ms SLO, so it holds at most 3 sequences; each request occupies decode for t_d = 10 s.
"""

import pytest

from scheduler.conductor import Conductor
from scheduler.config import SchedulerConfig
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel
from scheduler.types import REJECT_TBT, ScheduleRequest


def make(admission):
    cfg = SchedulerConfig(block_tokens=100, admission=admission, ttft_slo=0.0, tbt_slo=0.035,
                          decode_occupancy=10.0)
    conductor = Conductor(cfg, prefill_model=PrefillTimeModel((1.0, 0.0, 0.0)),
                          tbt_model=DecodeTbtModel((0.0, 0.01, 0.0)))
    conductor.add_prefill("P")
    conductor.add_decode("D", kv_capacity_tokens=1_000_000)
    return conductor


def arrive(conductor, rid, now):
    return conductor.schedule(ScheduleRequest(rid, [rid], 100, 10), now)


def run_script(admission):
    """Four arrivals at t=0, their prefills end at t=1, 2, 3, 4, one more arrival at t=10.5."""
    conductor = make(admission)
    decisions = {rid: arrive(conductor, rid, 0.0) for rid in ("r0", "r1", "r2", "r3")}
    admitted = {}
    for t, rid in enumerate(("r0", "r1", "r2", "r3"), start=1):
        if decisions[rid].accepted:
            conductor.prefill_finished(rid, float(t))
            admitted[rid] = conductor.admit_decode(rid, float(t))
    decisions["r4"] = arrive(conductor, "r4", 10.5)
    return decisions, admitted


def test_predictive_sees_the_requests_already_in_prefill():
    decisions, admitted = run_script("predictive")
    # r3 would finish prefill at t=4 while r0..r2 still decode: 4 x 10 ms > 35 ms.
    assert [d.accepted for d in decisions.values()] == [True, True, True, False, True]
    assert decisions["r3"].reason == REJECT_TBT
    assert decisions["r3"].decode_load == pytest.approx(0.04 / 0.035)
    assert admitted == {"r0": "D", "r1": "D", "r2": "D"}
    # r4 ends prefill at 11.5; r0 (started 1) has left by then under t_d = 10 s.
    assert decisions["r4"].decode_load == pytest.approx(0.03 / 0.035)


def test_plain_early_rejection_admits_on_a_stale_view_then_wastes_prefill():
    decisions, admitted = run_script("early")
    # At t=0 decode is empty, so all four pass; r3's prefill is wasted at decode.
    assert [decisions[r].accepted for r in ("r0", "r1", "r2", "r3")] == [True] * 4
    assert admitted == {"r0": "D", "r1": "D", "r2": "D", "r3": None}
    # At t=10.5 decode still holds three sequences, so r4 is turned away though r0 leaves soon.
    assert decisions["r4"].reason == REJECT_TBT


def test_no_admission_control_accepts_everything_at_arrival():
    decisions, admitted = run_script("none")
    assert all(d.accepted for d in decisions.values())
    assert admitted["r3"] is None


def test_learned_decode_occupancy_follows_observed_durations():
    conductor = make("predictive")
    arrive(conductor, "r0", 0.0)
    conductor.prefill_finished("r0", 1.0)
    conductor.admit_decode("r0", 1.0)
    conductor.decode_finished("r0", 31.0)  # occupied decode for 30 s
    assert conductor.forecast.occupancy == pytest.approx(10.0 + 0.05 * 20.0)
    assert conductor.inflight == {} and conductor.decode["D"].batch == 0
