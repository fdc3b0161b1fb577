"""The shared-memory transport: same-host peers whose buffers live in named /dev/shm regions.

The initiator maps the peer's region once (cached per region name) and a slice is one copy
between the two views; above ``transfer.memory.SMALL_COPY`` it is numpy's, which releases the
GIL, so the copy threads run in parallel with each other and with the rest of the engine. A submission is one queue of slices
that every copy thread drains, not one pool task per slice: for a 64 KiB slice the hand-off to
the pool costs more than the copy. Slices that continue each other on both sides (a batch of
small requests over contiguous memory, as KV pages and the benchmark are laid out) are copied as
one run of up to ``RUN_BYTES``: one large copy, without the GIL, instead of a Python round per
slice. A region that cannot be opened means the peer restarted or went away: the slice fails
without retry.
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
        queue = collections.deque(pieces)  # in submission order: the first requests land first
        first = queue.popleft()
        for _ in range(min(self._threads, len(queue))):
            self._pool.submit(self._drain, queue)
        self._copy(first, queue, {})

    def _drain(self, queue: collections.deque[Slice]) -> None:
        """Copy runs of slices off the shared ``queue`` until it is empty. Each region is mapped
        and checked alive once per drain rather than once per slice."""
        views: dict[str, memoryview] = {}
        while True:
            try:
                piece = queue.popleft()
            except IndexError:
                return
            self._copy(piece, queue, views)

    def _copy(self, first: Slice, queue: collections.deque[Slice], views: dict[str, memoryview]) -> None:
        """Copy ``first`` and the slices at the head of ``queue`` that continue it inside the same
        peer buffer, as one run."""
        try:
            buffer = first.peer.find_buffer(first.remote_address, first.length)
            view = views.get(buffer.shm_name)
            if view is None:
                view = views[buffer.shm_name] = self.region_view(first.peer, buffer)
        except (OSError, ValueError) as exc:
            self._sink.failed(first, f"cannot map {first.peer.name}'s memory: {exc}", None, fatal=True)
            return
        run = [first]
        size, room = first.length, buffer.end - first.remote_address
        while size < RUN_BYTES:
            try:
                following = queue.popleft()
            except IndexError:
                break
            if not run[-1].continued_by(following) or size + following.length > room:
                queue.appendleft(following)  # another thread may have taken the next one: fine
                break
            run.append(following)
            size += following.length
        start = first.remote_address - buffer.address
        try:
            local = first.local_buffer.view[first.local_offset:first.local_offset + size]
            remote = view[start:start + size]  # ValueError once forget_peer released it
        except ValueError as exc:
            for piece in run:
                self._sink.failed(piece, f"cannot map {first.peer.name}'s memory: {exc}", None, fatal=True)
            return
        try:
            _copy(first.opcode, local, remote)
        except Exception as exc:  # reported, or its requests would wait for their deadline
            for piece in run:
                self._sink.failed(piece, f"copy failed: {exc!r}", None, fatal=True)
            return
        for piece in run:
            self._sink.done(piece)

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


def _copy(opcode: OpCode, local: memoryview, remote: memoryview) -> None:
    if opcode == OpCode.WRITE:
        copy_into(remote, local)
    else:
        copy_into(local, remote)
