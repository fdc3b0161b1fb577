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
    def __init__(self, request: TransferRequest, deadline: float) -> None:
        self.request = request
        self.deadline = deadline
        self._lock = threading.Lock()
        self._remaining = 0
        self._transferred = 0
        self._failed: str | None = None

    def expect(self, num_slices: int) -> None:
        self._remaining = num_slices

    def slice_done(self, length: int) -> None:
        with self._lock:
            self._remaining -= 1
            self._transferred += length

    def fail(self, reason: str) -> None:
        with self._lock:
            if self._failed is None:
                self._failed = reason

    @property
    def finished(self) -> bool:
        return self._failed is not None or self._remaining == 0

    def pending(self, now: float) -> bool:
        """``status(now).status == Status.PENDING`` without building the status (checked for
        every request of a batch whenever one is freed or waited for)."""
        with self._lock:
            return self._failed is None and self._remaining != 0 and now <= self.deadline

    def status(self, now: float | None = None) -> TransferStatus:
        with self._lock:
            if self._failed is not None:
                return TransferStatus(Status.FAILED, self._transferred, self._failed)
            if self._remaining == 0:
                return TransferStatus(Status.COMPLETED, self._transferred)
            if (time.monotonic() if now is None else now) > self.deadline:
                return TransferStatus(Status.TIMEOUT, self._transferred, "deadline passed")
            return TransferStatus(Status.PENDING, self._transferred)


class Slice:
    """One contiguous piece of a task, moved as a unit by one transport on one path."""

    __slots__ = ("task", "index", "local", "local_buffer", "local_offset", "location", "remote_address",
                 "length", "attempt", "peer", "transport")

    def __init__(self, task: Task, index: int, local_buffer: Any, local_offset: int, length: int,
                 remote_address: int, peer: Any, transport: Any) -> None:
        """``local_buffer``: the RegisteredBuffer holding the local bytes, from ``local_offset``."""
        self.task, self.index = task, index
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

    def continued_by(self, other: Slice) -> bool:
        """Whether ``other`` moves the bytes right after this slice's on both sides, the same way:
        the two can then be moved as one."""
        return (other.local_buffer is self.local_buffer and other.peer is self.peer
                and other.local_offset == self.local_offset + self.length
                and other.remote_address == self.remote_address + self.length
                and other.task.request.opcode == self.task.request.opcode)


class Batch:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tasks: list[Task] = []

    def pending(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return any(t.pending(now) for t in self.tasks)


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
