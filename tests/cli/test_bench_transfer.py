"""`mooncake bench transfer`: the engine's figure beside both limits, measured in the same run."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_bench_transfer_reports_the_engine_beside_its_limits(mooncake, protocol):
    data = mooncake.json("bench", "transfer", "--protocol", protocol, "--block-size", "64KiB",
                         "--batch-size", "4", "--duration", "0.3")
    assert data["gbps"] > 0 and data["memcpy_gbps"] > 0 and data["raw_socket_gbps"] > 0
    assert data["vs_memcpy"] == pytest.approx(data["gbps"] / data["memcpy_gbps"])
    assert data["vs_raw_socket"] == pytest.approx(data["gbps"] / data["raw_socket_gbps"])


def test_raw_socket_limit_counts_every_byte_of_a_working_set_larger_than_one_block():
    from transfer.bench import raw_socket_gbps

    # A working set that is not a multiple of the block, so the receiver's offset wraps mid-block:
    # the limit raises when the receiver's count differs from the bytes sent.
    assert raw_socket_gbps(48 << 10, 0.05, working_set=1 << 20) > 0
