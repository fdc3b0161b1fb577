"""Small trace replays checked against numbers computed by hand.

Cost model: prefill 1 ms per new token, decode 10 ms per step whatever the batch, transfers
of 2048 tokens take 0.1 s on the wire plus 1 ms latency. Blocks are the trace's 512 tokens.
"""

import pytest

from scheduler.conductor import PREFILL_REFIT
from scheduler.config import SchedulerConfig
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel
from scheduler.sim.cost_model import CostModel
from scheduler.sim.engine import Simulator, SimSetup, simulate
from scheduler.sim.trace import TraceRequest

COST = CostModel(bytes_per_token=1, bandwidth=20480.0, link_latency=0.001,
                 prefill=PrefillTimeModel((0.0, 1e-3, 0.0)), decode=DecodeTbtModel((0.01, 0.0, 0.0)))


def cfg(**changes):
    base = SchedulerConfig(block_tokens=512, ttft_slo=0.0, tbt_slo=0.0, admission="none",
                           bytes_per_token=1, bandwidth=20480.0)
    return base.with_(**changes)


ONE_INSTANCE = [
    TraceRequest(0.0, 1024, 10, (1, 2)),
    TraceRequest(0.0, 1024, 10, (1, 3)),  # shares block 1, but r0 has not stored it yet
    TraceRequest(5.0, 1536, 20, (1, 2, 4)),  # reuses r0's two blocks
]


def test_one_prefill_instance_queues_and_reuses_its_own_prefix():
    result = simulate(ONE_INSTANCE, cfg(), SimSetup(num_prefill=1, num_decode=1, cost=COST))
    # r0: 0 -> 1.024; r1 waits behind it: 1.024 -> 2.048; r2 computes 512 new tokens: 5 -> 5.512.
    assert result.ttft == pytest.approx([1.024, 2.048, 0.512])
    assert result.tbt == pytest.approx([0.01, 0.01, 0.01])
    assert result.hit_tokens == 1024 and result.hit_rate == pytest.approx(1024 / 3584)
    assert result.prefill_compute_seconds == pytest.approx(2.56)
    assert result.goodput == 3 and result.rejected == 0
    assert result.queue_seconds == pytest.approx([0.0, 1.024, 0.0])  # r1 waited for r0
    assert result.sim_seconds == pytest.approx(5.512 + 20 * 0.01)
    assert dict(result.reasons) == {"miss": 2, "local_hit": 1}
    # One load sample a second up to the last arrival: at t=1 r0 runs and r1 waits behind it.
    assert [(s["t"], s["prefill_requests"]) for s in result.samples] == [
        (0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 0.0), (4.0, 0.0), (5.0, 0.0)]


def test_ttft_slo_rejects_the_queued_request_at_arrival():
    result = simulate(ONE_INSTANCE, cfg(ttft_slo=1.5), SimSetup(num_prefill=1, num_decode=1, cost=COST))
    assert result.reasons["reject_ttft"] == 1
    assert result.ttft == pytest.approx([1.024, 0.512])
    assert result.goodput == 2


TWO_INSTANCES = [
    TraceRequest(0.0, 2048, 1, (1, 2, 3, 4)),  # prefill-0, stores blocks 1-4 at 2.048
    TraceRequest(2.1, 10000, 1, (9,)),  # prefill-0 again (tie): busy until 12.1
    TraceRequest(3.0, 2560, 1, (1, 2, 3, 4, 5)),  # prefill-1 pulls blocks 1-4 from prefill-0
    TraceRequest(4.0, 3072, 1, (1, 2, 3, 4, 5, 6)),  # prefill-1 now holds 1-5 itself
]


def test_busy_holder_makes_the_other_instance_pull_and_replicate_the_prefix():
    result = simulate(TWO_INSTANCES, cfg(), SimSetup(num_prefill=2, num_decode=1, cost=COST))
    assert dict(result.reasons) == {"miss": 2, "transfer": 1, "local_hit": 1}
    # r2: 0.101 s transfer + 512 new tokens; r3: 512 new tokens on prefill-1's replica.
    assert result.ttft == pytest.approx([2.048, 0.613, 0.512, 10.0])
    assert result.transferred_tokens == 2048
    assert result.hit_tokens == 2048 + 2560
    assert result.transfer_seconds == pytest.approx(0.101)


def test_local_scope_never_transfers():
    result = simulate(TWO_INSTANCES, cfg(transfers=False), SimSetup(num_prefill=2, num_decode=1, cost=COST))
    assert result.transferred_tokens == 0 and result.reasons["transfer"] == 0
    # r2 recomputes on prefill-1 (2.56 s beats waiting for prefill-0 until 12.1).
    assert result.ttft[1] == pytest.approx(2.56)


def test_decode_batch_shares_steps_and_full_decode_rejects_after_prefill():
    cost = CostModel(prefill=PrefillTimeModel((1.0, 0.0, 0.0)), decode=DecodeTbtModel((0.0, 0.01, 0.0)))
    trace = [TraceRequest(0.0, 100, 100, (i,)) for i in range(3)]
    result = simulate(trace, cfg(tbt_slo=0.025), SimSetup(num_prefill=3, num_decode=1, cost=cost))
    # All three finish prefill at t=1; the decode instance fits two (20 ms <= 25 ms).
    assert result.reasons["reject_decode"] == 1
    assert result.wasted_prefill_seconds == pytest.approx(1.0)  # the rejected one's prefill
    assert result.tbt == pytest.approx([0.02, 0.02])
    assert result.sim_seconds == pytest.approx(1.0 + 100 * 0.02)


def test_a_conductor_planning_from_other_costs_learns_the_simulated_ones():
    # As live: the conductor starts from a start-up profile 4x too fast, and learns what the
    # prefills really take from each one it sees finish (after PREFILL_REFIT, exactly).
    profile = CostModel(prefill=PrefillTimeModel((0.0, 2.5e-4, 0.0)), decode=COST.decode)
    trace = [TraceRequest(2.0 * i, 512 * (1 + i % 4), 1, (100 + i,)) for i in range(PREFILL_REFIT)]
    knowing = Simulator(trace, cfg(), SimSetup(num_prefill=1, num_decode=1, cost=COST))
    learning = Simulator(trace, cfg(), SimSetup(num_prefill=1, num_decode=1, cost=COST, planned_with=profile))
    assert knowing.run().ttft == pytest.approx(learning.run().ttft)  # what happens is the truth's
    assert learning.conductor.prefill_model.coef == pytest.approx(COST.prefill.coef, abs=1e-9)
    # One that knows the truth from the start has nothing to learn: nothing observed.
    assert not knowing.conductor.prefill_samples
