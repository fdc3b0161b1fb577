"""Algorithm 1 on hand-built clusters: the exact instance chosen and why.

Models are chosen to make the arithmetic visible: prefill costs 1 ms per new token, a transfer
0.1 ms per token, blocks hold 100 tokens, and every prompt is 600 tokens (6 blocks).
"""

import pytest

from scheduler.conductor import Conductor
from scheduler.config import SchedulerConfig
from scheduler.predictors import DecodeTbtModel, PrefillTimeModel, TransferTimeModel
from scheduler.types import LOCAL_HIT, MISS, RECOMPUTE, REJECT_TBT, REJECT_TTFT, TRANSFER, ScheduleRequest

KEYS = [f"b{i}" for i in range(6)]


def make(threshold=None, policy="kvcentric", ttft_slo=0.0, tbt_slo=0.0, admission="none"):
    cfg = SchedulerConfig(block_tokens=100, threshold=threshold, policy=policy, ttft_slo=ttft_slo,
                          tbt_slo=tbt_slo, admission=admission)
    conductor = Conductor(cfg, prefill_model=PrefillTimeModel((0.0, 1e-3, 0.0)),
                          transfer_model=TransferTimeModel(bytes_per_token=1, bandwidth=1e4, latency=0.0),
                          tbt_model=DecodeTbtModel((0.0, 0.01, 0.0)))
    for name in ("A", "B"):
        conductor.add_prefill(name)
    conductor.add_decode("D", kv_capacity_tokens=10_000)
    conductor.index.block_stored("A", KEYS[:4])
    return conductor


def request(rid="r", keys=KEYS):
    return ScheduleRequest(rid, keys, input_length=600, expected_output=10)


def busy(conductor, instance, seconds):
    conductor.prefill[instance].enqueue("filler", seconds, now=0.0)


def test_idle_holder_of_the_prefix_wins_with_a_local_hit():
    d = make().schedule(request(), now=0.0)
    # A: 0 queue + 200 new tokens = 0.2 s. B: pull 400 tokens (0.04 s) + 0.2 s = 0.24 s.
    assert (d.prefill_id, d.reason, d.decode_id) == ("A", LOCAL_HIT, "D")
    assert d.predicted_ttft == pytest.approx(0.2)
    assert d.candidates == pytest.approx({"A": 0.2, "B": 0.24})
    assert d.prefix_tokens == 400 and d.transfer_keys == ()


def test_busy_holder_makes_the_idle_instance_pull_the_prefix_and_keep_it():
    conductor = make()
    busy(conductor, "A", 1.0)
    d = conductor.schedule(request(), now=0.0)
    assert (d.prefill_id, d.reason, d.transfer_from) == ("B", TRANSFER, "A")
    assert d.transfer_keys == tuple(KEYS[:4]) and d.transfer_tokens == 400
    assert d.predicted_transfer == pytest.approx(0.04)
    assert d.predicted_ttft == pytest.approx(0.24)
    # The queue now counts this request's transfer and prefill.
    assert conductor.prefill["B"].queue_time(0.0) == pytest.approx(0.24)


def test_fixed_threshold_above_the_gain_recomputes_instead():
    conductor = make(threshold=500)
    busy(conductor, "A", 1.0)
    d = conductor.schedule(request(), now=0.0)
    assert (d.prefill_id, d.reason, d.prefix_tokens) == ("B", RECOMPUTE, 0)
    assert d.predicted_ttft == pytest.approx(0.6)


def test_fixed_threshold_below_the_gain_transfers_even_when_recompute_is_cheaper():
    conductor = make(threshold=100)
    conductor.transfer_model.seconds_per_token = 5e-3  # a congested link: 2 s for 400 tokens
    busy(conductor, "A", 10.0)
    d = conductor.schedule(request(), now=0.0)
    assert (d.prefill_id, d.reason) == ("B", TRANSFER)
    assert d.predicted_ttft == pytest.approx(2.2)
    auto = make()
    auto.transfer_model.seconds_per_token = 5e-3
    busy(auto, "A", 10.0)
    assert auto.schedule(request(), now=0.0).reason == RECOMPUTE  # auto compares both: 0.6 < 2.2


def test_nothing_cached_anywhere_is_a_miss_on_the_least_loaded():
    conductor = make()
    busy(conductor, "A", 0.5)
    d = conductor.schedule(request(keys=["x0", "x1"]), now=0.0)
    assert (d.prefill_id, d.reason, d.predicted_ttft) == ("B", MISS, pytest.approx(0.6))


def test_ttft_slo_rejects_when_no_instance_can_meet_it():
    d = make(ttft_slo=0.15).schedule(request(), now=0.0)
    assert (d.reason, d.accepted, d.prefill_id) == (REJECT_TTFT, False, "A")


def test_early_admission_rejects_when_decode_is_full_now():
    conductor = make(tbt_slo=0.025, admission="early")
    conductor.decode["D"].admit("x", 10)
    conductor.decode["D"].admit("y", 10)  # a third sequence would make TBT 0.03 > 0.025
    d = conductor.schedule(request(), now=0.0)
    assert (d.reason, d.decode_id) == (REJECT_TBT, None)
    assert d.decode_load == pytest.approx(1.2)


def test_baselines_choose_by_their_own_rule():
    conductor = make(policy="load")
    busy(conductor, "A", 0.1)
    assert conductor.schedule(request("l"), now=0.0).prefill_id == "B"  # shortest queue
    conductor = make(policy="cache")
    busy(conductor, "A", 5.0)
    d = conductor.schedule(request("c"), now=0.0)
    assert (d.prefill_id, d.reason) == ("A", LOCAL_HIT)  # longest prefix despite the queue
    seen = set()
    conductor = make(policy="random")
    for i in range(40):
        d = conductor.schedule(request(f"r{i}"), now=0.0)
        assert d.reason != TRANSFER  # baselines never move KV
        seen.add(d.prefill_id)
    assert seen == {"A", "B"}


def _auto_at_rate(times, threshold=None):
    """A holds 4 of 6 blocks and has 0.05 s queued; B is idle. ``times``: earlier admissions."""
    conductor = make(threshold=threshold)
    conductor._admitted.extend(times)
    conductor.prefill["A"].enqueue("filler", 0.05, now=1.0)
    return conductor


def test_auto_charges_the_delay_a_placement_imposes_on_later_arrivals():
    # TTFT: A = 0.05 queue + 0.2 prefill = 0.25 (D = 0.2 s of work); B = 0.04 pull + 0.2 = 0.24
    # (D = 0.24). cost = TTFT * (1 + rate * D), rate per prefill instance.
    # 3 admissions over 1 s on 2 instances: rate 1/s. A 0.25*1.2 = 0.3 > B 0.24*1.24 = 0.2976.
    slow = _auto_at_rate([0.0, 0.5, 1.0])
    assert slow.arrival_rate(1.0) == pytest.approx(1.0)
    d = slow.schedule(request(), now=1.0)
    assert (d.prefill_id, d.reason, d.transfer_tokens) == ("B", TRANSFER, 400)
    assert d.candidates == pytest.approx({"A": 0.25, "B": 0.24})  # still plain TTFTs
    # 5 admissions over 1 s: rate 2/s. A 0.25*1.4 = 0.35 < B 0.24*1.48 = 0.3552: the holder
    # wins although its own TTFT is 10 ms longer, because it adds 40 ms less work to the queues.
    busy = _auto_at_rate([0.0, 0.25, 0.5, 0.75, 1.0])
    assert busy.arrival_rate(1.0) == pytest.approx(2.0)
    d = busy.schedule(request(), now=1.0)
    assert (d.prefill_id, d.reason, d.transfer_tokens) == ("A", LOCAL_HIT, 0)
    assert d.predicted_ttft == pytest.approx(0.25)
    assert busy.arrival_rate(1.0) == pytest.approx(2.5)  # counts its own admission
    # A fixed threshold keeps Algorithm 1's rule at any rate: least TTFT, B pulls.
    fixed = _auto_at_rate([0.0, 0.25, 0.5, 0.75, 1.0], threshold=0)
    assert fixed.schedule(request(), now=1.0).prefill_id == "B"


def test_arrival_rate_needs_two_admissions_apart():
    conductor = make()
    assert conductor.arrival_rate(5.0) == 0.0
    conductor._admitted.extend([2.0, 2.0])
    assert conductor.arrival_rate(2.0) == 0.0
    assert conductor.arrival_rate(3.0) == pytest.approx(0.5)  # 1 interval / 1 s / 2 instances


def test_auto_charge_never_picks_past_the_ttft_slo_when_another_meets_it():
    # As the busy case above, but with a TTFT SLO of 0.245 s only B (0.24) meets it.
    conductor = make(ttft_slo=0.245)
    conductor._admitted.extend([0.0, 0.25, 0.5, 0.75, 1.0])
    conductor.prefill["A"].enqueue("filler", 0.05, now=1.0)
    d = conductor.schedule(request(), now=1.0)
    assert (d.prefill_id, d.reason, d.accepted) == ("B", TRANSFER, True)
