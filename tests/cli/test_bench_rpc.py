"""`mooncake bench rpc`: both transports measured against their own floors, in a stable schema."""

from __future__ import annotations


def test_bench_rpc_reports_tcp_and_unix_with_their_floors_beside_a_busy_loop(mooncake):
    data = mooncake.json("bench", "rpc", "--requests", "200", "--load", "1")
    assert data["load"] == 1
    for figures in (data, data["unix"]):
        assert figures["latency_us"]["requests"] == 100
        assert 0 < figures["latency_us"]["p50"] <= figures["latency_us"]["p99"]
        assert 0 < figures["floor_latency_us"]["p50"] <= figures["floor_latency_us"]["p99"]
        assert set(figures["ops_per_s"]) == {"1", "8", "64"}
        assert all(ops > 0 for ops in figures["ops_per_s"].values())
