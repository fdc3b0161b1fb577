"""Batches, requests and slices: the state of transfers in flight.

A :class:`Task` is one submitted request; it is cut into :class:`Slice` s that transports move
independently (possibly on different paths). A slice that fails may be retried; the task ends
COMPLETED when every slice landed, FAILED when a slice ran out of retries, TIMEOUT when its
deadline passed first. Status is computed when asked, so a dead peer cannot leave a request
PENDING past its deadline even if no thread ever reports on it.

Cutting is pure (:func:`cut`): requests up to ``threshold`` bytes move as one slice. Longer ones
are cut into ``slice_size`` pieces; like Mooncake, a tail shorter than slice_size /
fragment_ratio is merged into the previous slice rather than sent as a tiny fragment that costs
a full per-slice overhead.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from transfer.errors import TooManyRequests


class OpCode(enum.IntEnum):
    READ = 0
    WRITE = 1


class Status(enum.IntEnum):
    WAITING = 0
    PENDING = 1
    INVALID = 2
    CANCELED = 3
    COMPLETED = 4
    TIMEOUT = 5
    FAILED = 6


class TransferRequest(NamedTuple):
    """READ copies target -> source; WRITE copies source -> target.

    ``source`` is a local address inside registered memory (see ``memory.address_of``);
    ``target_offset`` is an address inside one of the target segment's buffers. A named tuple,
    not a frozen dataclass: the store builds one per object of a batch, and a frozen
    dataclass's field-by-field ``object.__setattr__`` took several times as long.
    """

    opcode: OpCode
    source: int
    target_id: int
    target_offset: int
    length: int
    # The master's grant for the target range (transfer.grants), which an engine holding a
    # tenant's credential sends along; empty for one holding the cluster secret.
    grant: bytes = b""


@dataclass(frozen=True)
class TransferStatus:
    status: Status
    transferred_bytes: int
    error: str = ""


class Task:
    __slots__ = ("request", "deadline", "_batch", "_lock", "_remaining", "_transferred", "_failed")

    def __init__(self, request: TransferRequest, deadline: float, batch: Batch) -> None:
        self.request = request
        self.deadline = deadline
        self._batch = batch  # told once when this task ends (Batch.tasks_ended, Batch.task_failed)
        self._lock = threading.Lock()
        self._remaining = 1  # slices not yet landed: most requests are one (see expect)
        self._transferred = 0
        self._failed: str | None = None

    def expect(self, num_slices: int) -> None:
        self._remaining = num_slices

    def slice_done(self, length: int) -> None:
        if self._land(length):
            self._batch.tasks_ended(1, self._transferred)

    def _land(self, length: int) -> bool:
        """Count a landed slice; whether that ended the task (its last slice, and not failed
        before: a failure ended it already)."""
        with self._lock:  # the bytes first: a reader without the lock takes _remaining == 0 as final
            self._transferred += length
            self._remaining -= 1
            return self._remaining == 0 and self._failed is None

    @staticmethod
    def land_whole(tasks: tuple[Task, ...]) -> None:
        """Each of ``tasks`` (of one batch, each moved whole in the one slice that carried them
        all) is done; the batch is told once. Without the tasks' locks: a task moved in one
        slice has no other slice to race with, and that slice reports once."""
        ended = moved = 0
        for task in tasks:
            if not task.finished:
                task._transferred = length = task.request.length
                task._remaining = 0  # after the bytes: see _land
                ended += 1
                moved += length
        if ended:
            tasks[0]._batch.tasks_ended(ended, moved)

    def fail(self, reason: str) -> None:
        with self._lock:
            if self._failed is not None:
                return
            self._failed = reason
            ends = self._remaining != 0  # else its slices all landed: it ended then
        self._batch.task_failed(self._transferred if ends else 0, counted=not ends)

    @property
    def finished(self) -> bool:
        return self._failed is not None or self._remaining == 0

    def pending(self, now: float) -> bool:
        """``status(now).status == Status.PENDING`` without building the status (checked for
        every request of a batch whenever one is freed or waited for). Read without the lock:
        a task only ever goes from pending to settled, so a stale read says "pending" once too
        often, which the waiter's next look corrects."""
        return self._failed is None and self._remaining != 0 and now <= self.deadline

    def state(self, now: float) -> tuple[Status, int, str]:
        """(status, bytes moved, error): :meth:`status`'s content, without building it. Read
        without the lock, as :meth:`pending`: a settled task's fields no longer change (the
        bytes are counted before the last slice is), and a pending one's bytes may be one slice
        behind, as they may be a moment later anyway."""
        failed, transferred = self._failed, self._transferred
        if failed is not None:
            return Status.FAILED, transferred, failed
        if self._remaining == 0:
            return Status.COMPLETED, self._transferred, ""
        if now > self.deadline:
            return Status.TIMEOUT, transferred, "deadline passed"
        return Status.PENDING, transferred, ""

    def status(self, now: float | None = None) -> TransferStatus:
        return TransferStatus(*self.state(time.monotonic() if now is None else now))


class Slice:
    """One contiguous piece of a task, moved as a unit by one transport on one path."""

    __slots__ = ("task", "riders", "index", "local", "local_buffer", "local_offset", "location",
                 "remote_address", "length", "attempt", "peer", "transport")

    def __init__(self, task: Task, index: int, local_buffer: Any, local_offset: int, length: int,
                 remote_address: int, peer: Any, transport: Any, riders: tuple[Task, ...] = ()) -> None:
        """``local_buffer``: the RegisteredBuffer holding the local bytes, from ``local_offset``.
        ``riders``: whole requests that continue ``task``'s on both sides and travel in this
        slice after it (a run of small requests moved as one copy); each ends with the slice."""
        self.task, self.riders, self.index = task, riders, index
        self.local_buffer, self.local_offset, self.length = local_buffer, local_offset, length
        self.local = local_buffer.view[local_offset:local_offset + length]
        self.location = local_buffer.location
        self.remote_address = remote_address
        self.attempt = 0
        self.peer = peer  # the target's SegmentDescriptor
        self.transport = transport

    @property
    def opcode(self) -> OpCode:
        return self.task.request.opcode

    def landed(self) -> bool:
        """Count the slice's bytes to its requests; whether one of them has now finished."""
        if not self.riders:
            self.task.slice_done(self.length)
            return self.task.finished
        Task.land_whole((self.task, *self.riders))
        return True

    def fail(self, reason: str) -> None:
        for task in (self.task, *self.riders):
            task.fail(reason)

    def continued_by(self, other: Slice) -> bool:
        """Whether ``other`` moves the bytes right after this slice's on both sides, the same way:
        the two can then be moved as one."""
        return (other.local_buffer is self.local_buffer and other.peer is self.peer
                and other.local_offset == self.local_offset + self.length
                and other.remote_address == self.remote_address + self.length
                and other.task.request.opcode == self.task.request.opcode)


class Batch:
    """The requests submitted under one batch id. Besides its tasks it counts those that have
    not ended (and the bytes and failures of those that have), so that the common questions
    about a finished batch (is anything pending? how did it end?) take no pass over its tasks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tasks: list[Task] = []
        self._lock = threading.Lock()
        self._open = 0  # tasks neither done nor failed (a timed-out one is still open)
        self._moved = 0  # bytes of the tasks that ended
        self._failures = 0

    def add(self, requests: list[TransferRequest], deadline: float) -> list[Task]:
        """Tasks for ``requests``, or TooManyRequests (and none) beyond the capacity."""
        with self._lock:
            if len(self.tasks) + len(requests) > self.capacity:
                raise TooManyRequests(f"it holds {self.capacity} requests; {len(self.tasks)} used, "
                                      f"{len(requests)} more submitted")
            tasks = [Task(r, deadline, self) for r in requests]
            self.tasks.extend(tasks)
            self._open += len(tasks)
        return tasks

    def tasks_ended(self, count: int, moved: int) -> None:
        """``count`` tasks ended with all their slices landed, ``moved`` bytes in all."""
        with self._lock:
            self._open -= count
            self._moved += moved

    def task_failed(self, moved: int, counted: bool) -> None:
        """A task failed (``counted``: it had ended before, all landed, and fails after all)."""
        with self._lock:
            self._open -= 0 if counted else 1
            self._moved += moved
            self._failures += 1

    @property
    def open(self) -> int:
        """Tasks that have neither landed nor failed (some may have timed out)."""
        return self._open

    def pending(self, now: float | None = None) -> bool:
        if self._open == 0:
            return False
        now = time.monotonic() if now is None else now
        return any(t.pending(now) for t in self.tasks)

    def summary(self, now: float) -> TransferStatus:
        """The worst status among the requests, with the bytes moved by all of them and the
        first error."""
        with self._lock:
            if self._open == 0 and self._failures == 0:
                return TransferStatus(Status.COMPLETED, self._moved)
        worst, moved, error = Status.COMPLETED, 0, ""
        for task in self.tasks:
            status, transferred, reason = task.state(now)
            moved += transferred
            if status != Status.COMPLETED:
                if _SEVERITY.index(status) < _SEVERITY.index(worst):
                    worst = status
                error = error or reason
        return TransferStatus(worst, moved, error)


# From worst to best: a batch's summary shows the worst status among its requests.
_SEVERITY = [Status.FAILED, Status.TIMEOUT, Status.PENDING, Status.WAITING, Status.COMPLETED]


FRAGMENT_RATIO = 4


def cut(length: int, slice_size: int, threshold: int) -> list[tuple[int, int]]:
    """(offset, length) pairs covering [0, length)."""
    if length <= max(threshold, slice_size):
        return [(0, length)]
    pieces = [(offset, min(slice_size, length - offset)) for offset in range(0, length, slice_size)]
    last_offset, last_length = pieces[-1]
    if len(pieces) > 1 and last_length < slice_size // FRAGMENT_RATIO:
        pieces.pop()
        prev_offset, prev_length = pieces[-1]
        pieces[-1] = (prev_offset, prev_length + last_length)
    return pieces
