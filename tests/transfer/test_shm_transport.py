"""The shared-memory transport on its own: runs that reach past one peer buffer into the next.

A peer's buffers are separate /dev/shm regions, which may lie next to each other in the peer's
address space: slices that continue each other there are planned as one run, yet each buffer is
a mapping of its own. These tests describe such a peer by hand (two real regions, published at
adjacent addresses), which an engine cannot be made to produce on purpose.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from transfer.batch import Batch, OpCode, Slice, TransferRequest
from transfer.descriptor import BufferDesc, SegmentDescriptor, local_host_id
from transfer.memory import RegisteredBuffer
from transfer.shm import transport as shm
from transfer.shm.region import SharedRegion

KiB = 1024
PEER_BASE = 1 << 40  # the peer's address of its first buffer: any number; it is only published


class RecordingSink:
    """The engine's side of the transport (a SliceSink): which slices landed, which failed and why."""

    def __init__(self) -> None:
        self.landed: list[Slice] = []
        self.failures: list[tuple[Slice, str]] = []
        self._lock = threading.Lock()

    def done(self, piece: Slice) -> None:
        with self._lock:
            self.landed.append(piece)

    def failed(self, piece: Slice, reason: str, path: str | None, fatal: bool = False) -> None:
        with self._lock:
            self.failures.append((piece, reason))

    def settled(self, count: int, within: float = 5.0) -> bool:
        """Whether ``count`` slices ended (landed or failed) within ``within`` seconds."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            with self._lock:
                if len(self.landed) + len(self.failures) >= count:
                    return True
            time.sleep(0.01)
        return False


@pytest.fixture
def adjacent_peer():
    """A peer with two 64 KiB buffers published back to back, each its own shared region."""
    tag = f"t{os.getpid()}"
    regions = [SharedRegion(SharedRegion.owned_name(tag, i), 64 * KiB, create=True) for i in range(2)]
    peer = SegmentDescriptor(name="peer", incarnation="one", host_id=local_host_id(), buffers=[
        BufferDesc(PEER_BASE + i * 64 * KiB, 64 * KiB, "cpu:0", region.name) for i, region in enumerate(regions)])
    yield peer, regions
    for region in regions:
        region.close()


def _slices(peer: SegmentDescriptor, local: RegisteredBuffer, opcode: OpCode, count: int,
            length: int, transport: shm.ShmTransport) -> list[Slice]:
    """``count`` slices of ``length`` laid end to end on both sides from the peer's first buffer."""
    batch = Batch(count)
    requests = [TransferRequest(opcode, local.address + i * length, 0, PEER_BASE + i * length, length)
                for i in range(count)]
    tasks = batch.add(requests, time.monotonic() + 10)
    return [Slice(task, 0, local, i * length, length, PEER_BASE + i * length, peer, transport)
            for i, task in enumerate(tasks)]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_across_two_adjacent_peer_buffers_lands_whole_in_both(adjacent_peer, threads):
    """One run of four 32 KiB slices, two in each buffer: every slice is reported landed (none
    is left behind for a copy thread that already stopped) and each buffer holds its half."""
    peer, regions = adjacent_peer
    data = bytearray(os.urandom(128 * KiB))
    local = RegisteredBuffer(0x1000, len(data), "cpu:0", memoryview(data))
    record = RecordingSink()
    transport = shm.ShmTransport(local_host_id(), record, threads)
    try:
        pieces = _slices(peer, local, OpCode.WRITE, 4, 32 * KiB, transport)
        assert len(shm.plan_runs(pieces)) == 1, "the four continue each other: one run"
        transport.submit(pieces)
        assert record.settled(4), f"{len(record.landed)} of 4 slices reported"
        assert record.failures == []
        assert sorted(p.remote_address for p in record.landed) == [p.remote_address for p in pieces]
        assert bytes(regions[0].view) == data[:64 * KiB]
        assert bytes(regions[1].view) == data[64 * KiB:]

        back = bytearray(len(data))
        record.landed.clear()
        target = RegisteredBuffer(0x1000, len(back), "cpu:0", memoryview(back))
        transport.submit(_slices(peer, target, OpCode.READ, 4, 32 * KiB, transport))
        assert record.settled(4) and record.failures == []
        assert back == data
    finally:
        transport.close()


def test_a_run_into_a_removed_peer_buffer_fails_its_slices_there_and_lands_the_rest(adjacent_peer):
    """The second buffer's region is gone (its owner removed it): the slices in the first land,
    those in the second fail for good, each one reported."""
    peer, regions = adjacent_peer
    data = bytearray(os.urandom(128 * KiB))
    local = RegisteredBuffer(0x1000, len(data), "cpu:0", memoryview(data))
    regions[1].close()
    record = RecordingSink()
    transport = shm.ShmTransport(local_host_id(), record, 1)
    try:
        pieces = _slices(peer, local, OpCode.WRITE, 4, 32 * KiB, transport)
        transport.submit(pieces)
        assert record.settled(4), f"{len(record.landed) + len(record.failures)} of 4 slices reported"
        assert [p.remote_address for p in record.landed] == [p.remote_address for p in pieces[:2]]
        assert [p.remote_address for p, _ in record.failures] == [p.remote_address for p in pieces[2:]]
        assert all("cannot map" in reason for _, reason in record.failures)
        assert bytes(regions[0].view) == data[:64 * KiB]
    finally:
        transport.close()
