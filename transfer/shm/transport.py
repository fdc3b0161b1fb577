"""The shared-memory transport: same-host peers whose buffers live in named /dev/shm regions.

The initiator maps the peer's region once (cached per region name) and a slice is one copy
between the two views; above ``transfer.memory.SMALL_COPY`` it is numpy's, which releases the
GIL, so the copy threads run in parallel with each other and with the rest of the engine. A submission is one queue of slices
that every copy thread drains, not one pool task per slice: for a 64 KiB slice the hand-off to
the pool costs more than the copy. Slices that continue each other on both sides (a batch of
small requests over contiguous memory, as KV pages and the benchmark are laid out) are copied as
one run of up to ``RUN_BYTES``: one large copy, without the GIL, instead of a Python round per
slice; a stretch of at least ``LONG_RUN_BYTES`` in runs of that size (:func:`plan_runs`). A region
that cannot be opened means the peer restarted or went away: the slice fails without retry.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

from transfer.batch import OpCode, Slice
from transfer.descriptor import BufferDesc, SegmentDescriptor
from transfer.memory import copy_into
from transfer.shm.region import SharedRegion
from transfer.transport import SliceSink, Transport

# The most one copy thread takes off the queue as one run: small enough that a batch of a few
# MiB still spreads over the copy threads, large enough that the per-run Python work is noise.
RUN_BYTES = 4 << 20
# Past a threshold (3/4 of the last-level cache as glibc sizes it on x86: 48 MiB here) memcpy
# writes with non-temporal stores, which skip reading the destination into the cache first:
# one 64 MiB copy ran at 9.4 GB/s here where 4 MiB copies, one or two threads at a time, ran at
# 5-6. So a stretch this long goes in runs this long, and the copy threads take whole runs.
LONG_RUN_BYTES = 64 << 20


class ShmTransport(Transport):
    name = "shm"

    def __init__(self, host_id: str, sink: SliceSink, threads: int) -> None:
        self._host_id, self._sink, self._threads = host_id, sink, threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shm-copy")
        self._lock = threading.Lock()
        self._regions: dict[str, tuple[str, SharedRegion]] = {}  # region name -> (peer, region)

    def reaches(self, peer: SegmentDescriptor, buffer: BufferDesc) -> bool:
        return peer.host_id == self._host_id and buffer.shm_name is not None

    def submit(self, pieces: list[Slice]) -> None:
        """The caller's thread copies the first run itself, after handing the rest to the copy
        threads: in the tens of microseconds a copy thread takes to wake, it moves up to
        RUN_BYTES, and a submission of one run needs no thread at all. So this returns after
        that one copy, not at once."""
        if not pieces:
            return
        queue = collections.deque(plan_runs(pieces))  # in submission order: the first requests land first
        first = queue.popleft()
        for _ in range(min(self._threads, len(queue))):
            self._pool.submit(self._drain, queue)
        self._copy(first, {})

    def _drain(self, queue: collections.deque[list[Slice]]) -> None:
        """Copy runs off the shared ``queue`` until it is empty. Each region is mapped and checked
        alive once per drain rather than once per run."""
        views: dict[str, memoryview] = {}
        while True:
            try:
                run = queue.popleft()
            except IndexError:
                return
            self._copy(run, views)

    def _copy(self, run: list[Slice], views: dict[str, memoryview]) -> None:
        """Copy ``run`` (slices that continue each other) as one copy per peer buffer it reaches:
        two buffers may be adjacent in address only. The rest of a run is copied here, not put
        back on the queue, where no copy thread might be left to take it."""
        while run:
            run = self._copy_within_buffer(run, views)

    def _copy_within_buffer(self, run: list[Slice], views: dict[str, memoryview]) -> list[Slice]:
        """Copy the slices of ``run`` that lie in the peer buffer its first slice is in; the
        slices past that buffer, for the next copy (none once the peer cannot be mapped)."""
        first = run[0]
        try:
            buffer = first.peer.find_buffer(first.remote_address, first.length)
            view = views.get(buffer.shm_name)
            if view is None:
                view = views[buffer.shm_name] = self.region_view(first.peer, buffer)
        except (OSError, ValueError) as exc:
            for piece in run:
                self._sink.failed(piece, f"cannot map {first.peer.name}'s memory: {exc}", None, fatal=True)
            return []
        size, room, count = 0, buffer.end - first.remote_address, 0
        while count < len(run) and size + run[count].length <= room:
            size += run[count].length
            count += 1
        run, rest = run[:count], run[count:]
        start = first.remote_address - buffer.address
        try:
            local = first.local_buffer.view[first.local_offset:first.local_offset + size]
            remote = view[start:start + size]  # ValueError once forget_peer released it
        except ValueError as exc:
            for piece in run + rest:
                self._sink.failed(piece, f"cannot map {first.peer.name}'s memory: {exc}", None, fatal=True)
            return []
        try:
            _copy(first.opcode, local, remote)
        except Exception as exc:  # reported, or its requests would wait for their deadline
            for piece in run:
                self._sink.failed(piece, f"copy failed: {exc!r}", None, fatal=True)
            return rest
        for piece in run:
            self._sink.done(piece)
        return rest

    def region_view(self, peer: SegmentDescriptor, buffer: BufferDesc) -> memoryview:
        """The peer's ``buffer`` mapped here, for copies on the caller's thread (for a small
        transfer the hand-off to a copy thread and back costs far more than the copy).
        FileNotFoundError when its owner removed it; OSError/ValueError when it cannot be mapped."""
        region = self._attach(peer.name, buffer)
        if region.unlinked():  # the owner closed or restarted: this memory is nobody's now
            self._detach(buffer.shm_name)
            raise FileNotFoundError(f"region {buffer.shm_name} was removed by its owner")
        return region.view

    @staticmethod
    def copy_between(opcode: OpCode, local: memoryview, remote: memoryview) -> None:
        _copy(opcode, local, remote)

    def _attach(self, peer: str, buffer: BufferDesc) -> SharedRegion:
        name = buffer.shm_name
        assert name is not None
        with self._lock:
            entry = self._regions.get(name)
            if entry is None:
                entry = (peer, SharedRegion(name, buffer.length, create=False))
                self._regions[name] = entry
            return entry[1]

    def _detach(self, name: str | None) -> None:
        with self._lock:
            entry = self._regions.pop(name, None) if name else None
        if entry is not None:
            entry[1].close()

    def forget_peer(self, peer_name: str) -> None:
        with self._lock:
            names = [n for n, (peer, _) in self._regions.items() if peer == peer_name]
            regions = [self._regions.pop(n)[1] for n in names]
        for region in regions:
            region.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            regions = [region for _, region in self._regions.values()]
            self._regions.clear()
        for region in regions:
            region.close()


def plan_runs(pieces: list[Slice]) -> list[list[Slice]]:
    """``pieces`` in order, grouped into runs: slices that continue each other on both sides,
    up to RUN_BYTES a run, or up to LONG_RUN_BYTES within a stretch at least that long."""
    runs: list[list[Slice]] = []
    stretch: list[Slice] = []
    for piece in pieces:
        if stretch and not stretch[-1].continued_by(piece):
            runs += _cut(stretch)
            stretch = []
        stretch.append(piece)
    return runs + _cut(stretch)


def _cut(stretch: list[Slice]) -> list[list[Slice]]:
    limit = LONG_RUN_BYTES if sum(piece.length for piece in stretch) >= LONG_RUN_BYTES else RUN_BYTES
    runs: list[list[Slice]] = []
    size = 0
    for piece in stretch:
        if not runs or size + piece.length > limit:
            runs.append([])
            size = 0
        runs[-1].append(piece)
        size += piece.length
    return runs


def _copy(opcode: OpCode, local: memoryview, remote: memoryview) -> None:
    if opcode == OpCode.WRITE:
        copy_into(remote, local)
    else:
        copy_into(local, remote)
