"""Trace parsing, the capacity sweep, and the one check on the real conversation trace."""


import pytest

from scheduler.errors import TraceFormatError
from scheduler.sim.sweep import capacity_sweep, hit_rate
from scheduler.sim.trace import CONVERSATION_TRACE, TraceRequest, load_trace, multi_turn, parse_trace

REAL_TRACE = CONVERSATION_TRACE


def test_parse_scales_timestamps_and_rejects_bad_lines():
    lines = ['{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
             '', '{"timestamp": 3000, "input_length": 10, "output_length": 1, "hash_ids": [3]}']
    requests = parse_trace(lines, speedup=2.0)
    assert requests == [TraceRequest(0.5, 600, 5, (1, 2)), TraceRequest(1.5, 10, 1, (3,))]
    assert len(parse_trace(lines, limit=1)) == 1
    with pytest.raises(TraceFormatError, match="trace:1"):
        parse_trace(['{"timestamp": 0, "input_length": 5}'])
    with pytest.raises(TraceFormatError, match="not sorted"):
        parse_trace(list(reversed(lines)))
    with pytest.raises(TraceFormatError):
        load_trace("/nonexistent/trace.jsonl")


def test_hit_rate_by_capacity_on_a_hand_built_trace():
    trace = [TraceRequest(0.0, 1024, 1, (1, 2)), TraceRequest(0.0, 1024, 1, (3, 4)),
             TraceRequest(0.0, 1000, 1, (1, 2))]  # a partial last block counts its real length
    assert hit_rate(trace, None) == pytest.approx(1000 / 3048)
    assert hit_rate(trace, 1024) == 0.0  # two blocks: r1 evicts r0's
    assert [row["hit_rate"] for row in capacity_sweep(trace, (1024, 2048))] == pytest.approx([0.0, 1000 / 3048])


def test_multi_turn_keeps_the_conversations_with_enough_turns_in_order_from_zero():
    a1, b1, a2, c1, a3, b2 = (TraceRequest(t, 600, 1, ids) for t, ids in (
        (1.0, (0, 1)), (2.0, (0, 5)), (3.0, (0, 1, 2)), (4.0, (0, 7)), (5.0, (0, 1, 2, 3)), (6.0, (0, 5, 6))))
    trace = [a1, b1, a2, c1, a3, b2]
    assert [r.hash_ids for r in multi_turn(trace, 3)] == [(0, 1), (0, 1, 2), (0, 1, 2, 3)]
    assert [r.arrival for r in multi_turn(trace, 2)] == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert multi_turn(trace, 1) == [TraceRequest(r.arrival - 1.0, 600, 1, r.hash_ids) for r in trace]
    assert multi_turn(trace, 4) == []
    with pytest.raises(ValueError):
        multi_turn(trace, 0)


def test_real_conversation_trace_reuse_ratio_and_lru_curve():
    requests = load_trace(REAL_TRACE)
    assert len(requests) == 12031
    rows = capacity_sweep(requests, (1_000_000, 10_000_000, None))
    rates = [row["hit_rate"] for row in rows]
    assert rates[-1] == pytest.approx(0.374, abs=0.0005)  # the trace's own reuse ratio
    assert rates[0] < rates[1] < rates[2]
