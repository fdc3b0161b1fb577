"""Batch transfers (Mooncake's BatchTransfer model) and the retry policy for failed slices.

A whole submission is validated before anything moves: a bad address, length, segment or an
over-capacity batch raises its typed error and no byte is written. Accepted requests are cut
into slices and handed to the transport chosen per (request, peer buffer): shared memory when
the peer is on this host and its buffer is in a named region, else TCP. Small requests that
continue each other on both sides (KV pages, a benchmark's blocks) travel as one slice carrying
them all (a run), so a batch of them costs a few copies or sends, not one per request; each
request still ends with its own status. A failed slice goes back
to its transport on the next path until ``retry_count`` runs out or the request's deadline
passes; failures that another path cannot fix (a stale peer, a refused range) end it at once.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from transfer.batch import Batch, OpCode, Slice, Status, Task, TransferRequest, TransferStatus
from transfer.descriptor import BufferDesc, SegmentDescriptor
from transfer.errors import (BatchBusy, DeviceNotFound, InvalidArgument, MooncakeError, TooManyRequests,
                             TransferFailed, TransferTimeout)
from transfer.batch import cut
from transfer.memory import RegisteredBuffer
from transfer.shm.transport import RUN_BYTES, ShmTransport
from transfer.tcp.transport import TcpTransport
from transfer.transport import Transport

_HANDOFF = 32  # requests of a submission cut before their slices go to the transports


@dataclass
class _Seen:
    """What planning one batch already looked up: its last local and peer buffers, its peers by handle."""

    local: RegisteredBuffer | None = None
    peers: dict[int, SegmentDescriptor] = field(default_factory=dict)
    # The last peer buffer found, and whose: the next request mostly lies in it too.
    remote: BufferDesc | None = None
    remote_peer: SegmentDescriptor | None = None
    # The transport per peer buffer (by the BufferDesc's id: the peer's descriptor, which holds
    # it, outlives the call).
    transports: dict[int, Transport] = field(default_factory=dict)


class BatchMixin:
    def __init__(self) -> None:
        self._batches: dict[int, Batch] = {}
        self._batch_ids = itertools.count(1)
        self._batch_lock = threading.Lock()
        self._progress = threading.Condition()

    def allocate_batch_id(self, capacity: int) -> int:
        if not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgument(f"batch capacity must be a positive integer, not {capacity!r}")
        with self._batch_lock:
            batch_id = next(self._batch_ids)
            self._batches[batch_id] = Batch(capacity)
        return batch_id

    def free_batch_id(self, batch_id: int) -> None:
        """Refused (BATCH_BUSY) while any request of the batch is still pending."""
        with self._batch_lock:
            batch = self._batch(batch_id)
            if batch.pending():
                raise BatchBusy(f"batch {batch_id} still has pending requests")
            del self._batches[batch_id]

    def submit_transfer(self, batch_id: int, requests: list[TransferRequest]) -> None:
        """Validate every request (a typed error and nothing moved if one is bad), then start
        moving them; :meth:`wait_batch` or the statuses tell when they are done. Over shared
        memory the calling thread copies the first run itself (up to RUN_BYTES) before this
        returns, while the copy threads wake for the rest."""
        columns = _columns(requests)
        common = None if columns is None else self._common_plan(columns)
        if common is None:  # each request on its own; raises before anything is queued
            seen = _Seen()
            planned = [self._plan(r, seen) for r in requests]
        deadline = time.monotonic() + self.options.transfer_timeout
        with self._batch_lock:
            batch = self._batch(batch_id)
        try:
            tasks = batch.add(requests, deadline)
        except TooManyRequests as exc:
            raise TooManyRequests(f"batch {batch_id}: {exc}") from None
        if common is not None and self._moves_whole(common, columns.lengths, columns.grants):
            common[3].submit(_runs(tasks, common, self._run_limit(common), columns))  # cut in one pass
            return
        # Validated: the slices of every _HANDOFF requests leave at once, so the transports
        # move the first ones while the rest are still being cut.
        for first in range(0, len(tasks), _HANDOFF):
            chunk = tasks[first:first + _HANDOFF]
            plans = [common] * len(chunk) if common is not None else planned[first:first + _HANDOFF]
            for transport, pieces in self._cut(chunk, plans).items():
                transport.submit(pieces)

    def _common_plan(self, columns: _Columns) -> tuple | None:
        """One plan (see :meth:`_plan`) that holds for every request of a batch, checked in
        passes over its columns rather than a Python round per request: one valid opcode,
        positive integer lengths, one segment, inside one local and one peer buffer (a batch
        of KV pages, a benchmark's blocks). None for any other batch, whose requests are then
        planned, and refused, one by one."""
        opcodes, sources, target_ids, offsets, lengths, _ = columns
        # count, not a set: an enum member's hash is a Python call, its == is int's
        if (opcodes.count(opcodes[0]) != len(opcodes) or opcodes[0] not in (OpCode.READ, OpCode.WRITE)
                or target_ids.count(target_ids[0]) != len(target_ids) or set(map(type, lengths)) != {int}
                or min(lengths) <= 0):
            return None
        low, high = min(sources), max(map(operator.add, sources, lengths))
        remote_low, remote_high = min(offsets), max(map(operator.add, offsets, lengths))
        try:
            local = self.check_address(low, high - low)
            peer = self.segments.get(target_ids[0])
            remote = peer.find_buffer(remote_low, remote_high - remote_low)
            return local, peer, remote, self._transport_for(peer, remote)
        except MooncakeError:
            return None

    def _run_limit(self, plan: tuple) -> int:
        """How many bytes of whole requests under ``plan`` may travel as one slice (0: each
        its own). Shared memory copies a run at once; TCP sends one as it sends one large
        request, so up to the slice size, and it still stripes the runs over its streams."""
        local, _, _, transport = plan
        if local.location.startswith("cuda"):
            return 0  # staged through the device mirror request by request
        if isinstance(transport, ShmTransport):
            return RUN_BYTES
        return self.options.slice_size if isinstance(transport, TcpTransport) else 0

    def _moves_whole(self, plan: tuple, lengths: tuple[int, ...], grants: tuple[bytes, ...]) -> bool:
        """Whether requests of these lengths and grants, all under ``plan``, travel in runs
        (see :func:`_runs`): their transport takes runs, and each request is one slice that
        carries no grant (a peer checks a slice against its own request's grant)."""
        return (self._run_limit(plan) > 0 and not any(grants)
                and max(lengths) <= max(self.options.slice_size, self.options.slice_threshold))

    def _cut(self, tasks: list[Task], planned: list[tuple]) -> dict[Transport, list[Slice]]:
        """The slices of ``tasks``, by transport. Consecutive requests that travel whole (see
        :meth:`_moves_whole`), between the same two buffers in the same direction, go to
        :func:`_runs`, which lets the ones that continue each other travel as one slice."""
        by_transport: dict[Transport, list[Slice]] = {}
        group: list[Task] = []  # consecutive whole requests of one plan and opcode
        group_plan: tuple = ()

        def flush() -> None:
            columns = _Columns(*zip(*(task.request for task in group)))
            by_transport.setdefault(group_plan[3], []).extend(
                _runs(group, group_plan, self._run_limit(group_plan), columns))

        for task, plan in zip(tasks, planned):
            local, peer, remote, transport = plan
            request = task.request
            if not self._moves_whole(plan, (request.length,), (request.grant,)):
                pieces = self._slices(task, local, peer, transport)
                task.expect(len(pieces))
                by_transport.setdefault(transport, []).extend(pieces)
                continue
            if group and (group_plan[0] is not local or group_plan[2] is not remote
                          or group[0].request.opcode != request.opcode):
                flush()
                group = []
            if not group:
                group_plan = plan
            group.append(task)
        if group:
            flush()
        return by_transport

    def _plan(self, request: TransferRequest, seen: _Seen | None = None,
              ) -> tuple[RegisteredBuffer, SegmentDescriptor, BufferDesc, Transport]:
        """Check a request and find both its ends and its transport. ``seen`` carries what one
        call already looked up, for the many requests of a batch that share their buffers."""
        if not isinstance(request, TransferRequest):
            raise InvalidArgument(f"expected a TransferRequest, got {type(request).__name__}")
        if request.opcode not in (OpCode.READ, OpCode.WRITE):
            raise InvalidArgument(f"unknown opcode {request.opcode!r}")
        if not isinstance(request.length, int) or request.length <= 0:
            raise InvalidArgument(f"length must be a positive integer, not {request.length!r}")
        seen = seen or _Seen()
        local = seen.local
        if local is None or not local.address <= request.source <= local.end - request.length:
            local = seen.local = self.check_address(request.source, request.length)
        peer = seen.peers.get(request.target_id)
        if peer is None:
            peer = seen.peers[request.target_id] = self.segments.get(request.target_id)
        remote = seen.remote
        if (remote is None or seen.remote_peer is not peer
                or not remote.address <= request.target_offset <= remote.end - request.length):
            remote = seen.remote = peer.find_buffer(request.target_offset, request.length)
            seen.remote_peer = peer
        transport = seen.transports.get(id(remote))
        if transport is None:
            transport = seen.transports[id(remote)] = self._transport_for(peer, remote)
        return local, peer, remote, transport

    def _transport_for(self, peer: SegmentDescriptor, buffer: BufferDesc) -> Transport:
        for transport in self.transports:  # ordered fastest first
            if transport.reaches(peer, buffer):
                return transport
        raise DeviceNotFound(f"no {self.options.protocol} transport reaches segment {peer.name!r}")

    def _slices(self, task: Task, local: RegisteredBuffer, peer: SegmentDescriptor,
                transport: Transport) -> list[Slice]:
        """``local``: the registered buffer holding the request's source (found by _plan)."""
        request = task.request
        start = request.source - local.address
        return [Slice(task, index, local, start + offset, length, request.target_offset + offset, peer, transport)
                for index, (offset, length) in enumerate(
                    cut(request.length, self.options.slice_size, self.options.slice_threshold))]

    def get_transfer_status(self, batch_id: int, index: int) -> TransferStatus:
        with self._batch_lock:
            tasks = self._batch(batch_id).tasks
            if not 0 <= index < len(tasks):
                raise InvalidArgument(f"batch {batch_id} has no request {index}")
            return tasks[index].status()

    def get_batch_transfer_status(self, batch_id: int) -> TransferStatus:
        """The worst status among the batch's requests, with the bytes moved by all of them."""
        with self._batch_lock:
            batch = self._batch(batch_id)
        return batch.summary(time.monotonic())

    def wait_request(self, batch_id: int, index: int) -> TransferStatus:
        """Block until request ``index`` of the batch is no longer pending (its deadline ends
        this); its status. For a caller that works on each request's bytes as they land."""
        with self._batch_lock:
            batch = self._batch(batch_id)
            if not 0 <= index < len(batch.tasks):
                raise InvalidArgument(f"batch {batch_id} has no request {index}")
            task = batch.tasks[index]
        with self._progress:  # the lock ``done`` notifies with: a settling cannot be missed
            while batch.open and task.pending(time.monotonic()):
                self._progress.wait(0.05)
        return task.status()

    def wait_batch(self, batch_id: int, timeout: float | None = None) -> TransferStatus:
        """Block until no request of the batch is pending (each has a deadline, so this ends).

        The summary's worst status turns FAILED as soon as one request fails, while others may
        still be retrying on another path; waiting for every request keeps a caller that frees
        or reuses the batch (or its buffers) from racing with requests still in flight.
        """
        limit = None if timeout is None else time.monotonic() + timeout
        with self._batch_lock:
            batch = self._batch(batch_id)
        tasks = batch.tasks
        # A request stays settled (not PENDING) once it is, and requests mostly settle in the
        # order they were submitted: each wake-up looks at the first unsettled one onwards, not
        # at all of them (a batch of 128 small requests wakes this up to 128 times). Checked
        # under the lock that ``done`` notifies with, so a request settling between the check
        # and the wait cannot be missed.
        settled = 0
        with self._progress:
            while batch.open:
                now = time.monotonic()
                while settled < len(tasks) and not tasks[settled].pending(now):
                    settled += 1
                if settled == len(tasks) or (limit is not None and now >= limit):
                    break
                self._progress.wait(0.05)
        return self.get_batch_transfer_status(batch_id)

    def transfer_sync(self, requests: list[TransferRequest]) -> int:
        """Submit, wait, free; raises TransferFailed / TransferTimeout. Returns bytes moved."""
        batch_id = self.allocate_batch_id(max(1, len(requests)))
        try:
            self.submit_transfer(batch_id, requests)
            status = self.wait_batch(batch_id)
        finally:
            with self._batch_lock:
                self._batches.pop(batch_id, None)  # nothing pending left, or never submitted
        if status.status == Status.TIMEOUT:
            raise TransferTimeout(status.error or "transfer deadline passed")
        if status.status != Status.COMPLETED:
            raise TransferFailed(status.error or "transfer failed")
        return status.transferred_bytes

    def transfer_now(self, request: TransferRequest) -> bool:
        """Move one request on the caller's thread when shared memory or TCP reaches its peer
        and the local side is host memory: no batch, no copy or connection thread, no wait (the
        store's small puts and gets). False, with nothing done, when it needs a batch;
        TransferFailed when the peer's memory is gone or unreachable. Meant for small requests:
        a batch spreads big ones over threads and streams."""
        outcome = self.transfer_now_many([request])[0]
        if isinstance(outcome, MooncakeError):
            raise outcome
        return outcome

    def transfer_now_many(self, requests: list[TransferRequest]) -> list[bool | MooncakeError]:
        """:meth:`transfer_now` for each request, reporting instead of raising: True (moved),
        False (needs a batch) or the error. A peer's shared-memory region is mapped and checked
        alive once per call rather than once per request, and a peer reached over TCP gets all
        of the call's requests in one request group: a batch of small objects mostly lands in
        one or two segments. A batch under one plan (see :meth:`_common_plan`) is planned once;
        over TCP its requests that continue each other on both sides travel as one range."""
        if len(requests) == 1:
            return [self._move_one_now(requests[0])]
        uniform = self._uniform_plan(requests)
        if uniform is not None:
            columns, plan = uniform
            local, peer, _, transport = plan
            if isinstance(transport, TcpTransport):
                return self._move_runs_now(columns, local, peer, transport)
            pairs = self._mapped_views(columns, plan)
            if isinstance(pairs, MooncakeError):
                return [pairs] * len(requests)
            opcode = requests[0].opcode
            for local_view, remote_view in pairs:
                ShmTransport.copy_between(opcode, local_view, remote_view)
            return [True] * len(requests)
        outcomes: list[bool | MooncakeError] = [False] * len(requests)
        views: dict[str, memoryview] = {}  # region name -> its checked, mapped view
        by_peer: dict[tuple[str, str], tuple[TcpTransport, SegmentDescriptor, list[int], list]] = {}
        for n, request, plan in self._plan_each(requests):
            if isinstance(plan, MooncakeError):
                outcomes[n] = plan
                continue
            local, peer, remote, transport = plan
            if local.location.startswith("cuda") or not isinstance(transport, (ShmTransport, TcpTransport)):
                continue  # device staging or RDMA: a batch's work
            if isinstance(transport, TcpTransport):
                _, _, positions, moves = by_peer.setdefault(
                    (peer.name, local.location), (transport, peer, [], []))
                positions.append(n)
                moves.append(_move(local, request))
                continue
            outcomes[n] = self._copy_shared(views, plan, request)
        for (_, location), (transport, peer, positions, moves) in by_peer.items():
            for n, error in zip(positions, self._tcp_moved(transport, peer, location, moves)):
                outcomes[n] = error or True
        return outcomes

    def _move_one_now(self, request: TransferRequest) -> bool | MooncakeError:
        """transfer_now_many of one request (a store's single put or get), planned on its own:
        a batch's columns, common plan and grouping cost more than its move's own Python work
        (one 4 KiB READ over TCP: 20-23 us above the transport's move_now, 4-7 with this,
        /tmp/mb/tcplayers.py)."""
        try:
            plan = self._plan(request)
        except MooncakeError as exc:
            return exc
        local, peer, _, transport = plan
        if local.location.startswith("cuda"):
            return False
        if isinstance(transport, TcpTransport):
            return self._tcp_moved(transport, peer, local.location, [_move(local, request)])[0] or True
        if isinstance(transport, ShmTransport):
            return self._copy_shared({}, plan, request)
        return False

    def _copy_shared(self, views: dict[str, memoryview], plan: tuple, request: TransferRequest,
                     ) -> bool | MooncakeError:
        """Copy one request under a shared-memory ``plan`` (see :meth:`_mapped` for ``views``)."""
        local, peer, remote, transport = plan
        start = request.source - local.address
        try:
            remote_view = self._mapped(views, transport, peer, remote, request)
            transport.copy_between(request.opcode, local.view[start:start + request.length], remote_view)
        except (OSError, ValueError) as exc:
            return self._unmappable(peer, exc)
        return True

    def _tcp_moved(self, transport: TcpTransport, peer: SegmentDescriptor, location: str,
                   moves: list) -> list[TransferFailed | None]:
        """Move ``moves`` (see TcpTransport.move_now) on this thread: per move None or its error."""
        errors = transport.move_now(peer, location, moves)
        if any(errors):  # the peer may have restarted or moved, as after a batch's failure
            self.segments.invalidate(peer.name, peer.incarnation)
        return errors

    def shared_views(self, requests: list[TransferRequest],
                     ) -> list[tuple[memoryview, memoryview] | MooncakeError | None]:
        """Per request whose peer shared memory reaches, from host memory here: its (local,
        remote) byte views, for a caller that does more than move the bytes (the store client
        checksums them as it copies); each peer region is mapped and checked alive once per
        call. None for a request the engine must move (TCP, RDMA, GPU memory); the error for
        one that cannot be planned or whose peer's memory cannot be mapped."""
        shared: list[tuple[memoryview, memoryview] | MooncakeError | None] = [None] * len(requests)
        if not any(isinstance(t, ShmTransport) for t in self.transports):
            return shared  # TCP forced: nothing to plan twice
        # One request (a store's single get) is planned faster on its own: checking that a
        # batch shares one plan costs more than the plan (5.9 against 7.7 us, /tmp/mb/sv.py).
        uniform = self._uniform_plan(requests) if len(requests) > 1 else None
        if uniform is not None:
            columns, plan = uniform
            if not isinstance(plan[3], ShmTransport):
                return shared
            pairs = self._mapped_views(columns, plan)
            return [pairs] * len(requests) if isinstance(pairs, MooncakeError) else pairs
        views: dict[str, memoryview] = {}  # region name -> its checked, mapped view
        for n, request, plan in self._plan_each(requests):
            if isinstance(plan, MooncakeError):
                shared[n] = plan
                continue
            local, peer, remote, transport = plan
            if local.location.startswith("cuda") or not isinstance(transport, ShmTransport):
                continue
            start = request.source - local.address
            try:
                shared[n] = (local.view[start:start + request.length],
                             self._mapped(views, transport, peer, remote, request))
            except (OSError, ValueError) as exc:
                shared[n] = self._unmappable(peer, exc)
        return shared

    def _uniform_plan(self, requests: list[TransferRequest]) -> tuple[_Columns, tuple] | None:
        """For a batch under one plan (see :meth:`_common_plan`) from host memory to a peer
        that shared memory or TCP reaches: its columns and that plan. None for any other
        batch, which is planned request by request."""
        columns = _columns(requests)
        plan = None if columns is None else self._common_plan(columns)
        if plan is None:
            return None
        local, _, _, transport = plan
        if local.location.startswith("cuda") or not isinstance(transport, (ShmTransport, TcpTransport)):
            return None
        return columns, plan

    def _mapped_views(self, columns: _Columns, plan: tuple) -> list[tuple[memoryview, memoryview]] | MooncakeError:
        """Each request's (local, remote) byte views for a batch under one shared-memory
        ``plan``, from one mapping of the peer's region; the error when it cannot be mapped."""
        local, peer, remote, transport = plan
        try:
            region = transport.region_view(peer, remote)
        except (OSError, ValueError) as exc:
            return self._unmappable(peer, exc)
        mine, local_base, remote_base = local.view, local.address, remote.address
        return [(mine[source - local_base:source - local_base + length],
                 region[offset - remote_base:offset - remote_base + length])
                for source, offset, length in zip(columns.sources, columns.offsets, columns.lengths)]

    def _move_runs_now(self, columns: _Columns, local: RegisteredBuffer, peer: SegmentDescriptor,
                       transport: TcpTransport) -> list[bool | MooncakeError]:
        """Move a batch under one TCP plan on the calling thread, as one request group: its
        requests that continue each other on both sides (a batch of pages, a batch of objects
        placed one after the other) as one range each, up to the slice size, unless a grant
        travels with them (the target checks each range against its own request's grant)."""
        opcodes, sources, _, offsets, _, grants = columns
        view, base = local.view, local.address
        stretches = _stretches(columns, 0 if any(grants) else self.options.slice_size)
        moves = [(opcodes[start], view[sources[start] - base:sources[start] - base + length], offsets[start],
                  grants[start]) for start, _, length in stretches]
        errors = self._tcp_moved(transport, peer, local.location, moves)
        outcomes: list[bool | MooncakeError] = []
        for (start, stop, _), error in zip(stretches, errors):
            outcomes.extend([error or True] * (stop - start))
        return outcomes

    def _plan_each(self, requests: list[TransferRequest],
                   ) -> Iterator[tuple[int, TransferRequest, tuple | MooncakeError]]:
        """Each request with its position and its plan (see _plan), or the error that refused it;
        the lookups are shared across the requests."""
        seen = _Seen()
        for n, request in enumerate(requests):
            try:
                plan: tuple | MooncakeError = self._plan(request, seen)
            except MooncakeError as exc:
                plan = exc
            yield n, request, plan

    @staticmethod
    def _mapped(views: dict[str, memoryview], transport: ShmTransport, peer: SegmentDescriptor,
                remote: BufferDesc, request: TransferRequest) -> memoryview:
        """The request's range of the peer's region, mapping it (once per ``views``) first."""
        view = views.get(remote.shm_name)
        if view is None:
            view = views[remote.shm_name] = transport.region_view(peer, remote)
        offset = request.target_offset - remote.address
        return view[offset:offset + request.length]

    def _unmappable(self, peer: SegmentDescriptor, exc: Exception) -> TransferFailed:
        self.segments.invalidate(peer.name, peer.incarnation)  # it may have restarted or moved
        return TransferFailed(f"cannot map {peer.name}'s memory: {exc}")

    def write(self, segment: int | str, source: int, target_offset: int, length: int) -> int:
        """Blocking WRITE of local [source, +length) to the segment's address target_offset."""
        return self.transfer_sync([TransferRequest(OpCode.WRITE, source, self._handle(segment),
                                                   target_offset, length)])

    def read(self, segment: int | str, source: int, target_offset: int, length: int) -> int:
        """Blocking READ of the segment's [target_offset, +length) into local memory at source."""
        return self.transfer_sync([TransferRequest(OpCode.READ, source, self._handle(segment),
                                                   target_offset, length)])

    def _handle(self, segment: int | str) -> int:
        return segment if isinstance(segment, int) else self.open_segment(segment)

    def _batch(self, batch_id: int) -> Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise InvalidArgument(f"batch {batch_id} is not allocated")
        return batch

    # -- SliceSink: what transports report ---------------------------------------------------------

    def done(self, piece: Slice) -> None:
        if piece.landed():
            with self._progress:
                self._progress.notify_all()

    def failed(self, piece: Slice, reason: str, path: str | None, fatal: bool = False) -> None:
        now = time.monotonic()
        if path is not None:
            self.paths.mark_failed(path, now)
        task = piece.task
        if fatal or piece.attempt >= self.options.retry_count or now > task.deadline or task.finished:
            piece.fail(f"{reason} (after {piece.attempt + 1} attempt(s))")
            # The peer may have restarted or moved: the next use fetches its descriptor again.
            self.segments.invalidate(piece.peer.name, piece.peer.incarnation)
            with self._progress:
                self._progress.notify_all()
            return
        piece.attempt += 1
        piece.transport.submit([piece])


class _Columns(NamedTuple):
    """A batch's requests field by field (``zip(*requests)``), for passes at C speed."""

    opcodes: tuple[OpCode, ...]
    sources: tuple[int, ...]
    target_ids: tuple[int, ...]
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    grants: tuple[bytes, ...]


def _columns(requests: list[TransferRequest]) -> _Columns | None:
    """The requests' columns; None unless every one is a TransferRequest."""
    if not requests or set(map(type, requests)) != {TransferRequest}:
        return None
    return _Columns(*zip(*requests))


def _move(local: RegisteredBuffer, request: TransferRequest) -> tuple:
    """The request as one TCP move (see transfer.tcp.inline.Move); ``local`` holds its source."""
    start = request.source - local.address
    return request.opcode, local.view[start:start + request.length], request.target_offset, request.grant


def _runs(tasks: list[Task], plan: tuple, limit: int, columns: _Columns) -> list[Slice]:
    """The slices moving ``tasks`` (of one plan, each one slice; ``columns``: their requests'):
    one per stretch of requests that continue each other on both sides (see :func:`_stretches`)."""
    return [_run_slice(tasks[start:stop], plan, length) for start, stop, length in _stretches(columns, limit)]


def _stretches(columns: _Columns, limit: int) -> list[tuple[int, int, int]]:
    """(first request, after the last, bytes) of each stretch of requests that continue each
    other on both sides, up to ``limit`` bytes each (a longer request alone; limit 0: each
    request alone). Found with C-speed passes over the columns, not a Python round per request."""
    sources, offsets, lengths = columns.sources, columns.offsets, columns.lengths
    count = len(lengths)
    if count == 1:  # a single get or put: the passes below cost more than its move's planning
        return [(0, 1, lengths[0])]
    if len(set(lengths)) == 1 and sources == tuple(range(sources[0], sources[0] + count * lengths[0], lengths[0])) \
            and offsets == tuple(range(offsets[0], offsets[0] + count * lengths[0], lengths[0])):
        breaks: Iterable[int] = ()  # equal blocks laid end to end on both sides: one stretch
    else:
        ends = map(operator.add, sources, lengths)
        remote_ends = map(operator.add, offsets, lengths)
        breaks = itertools.compress(range(1, count), map(operator.or_, map(operator.ne, sources[1:], ends),
                                                         map(operator.ne, offsets[1:], remote_ends)))
    sums = list(itertools.accumulate(lengths, initial=0))  # sums[i]: bytes before request i
    stretches = []
    for start, stop in itertools.pairwise([0, *breaks, count]):
        while start < stop:
            end = max(start + 1, bisect.bisect_right(sums, sums[start] + limit, start + 1, stop + 1) - 1)
            stretches.append((start, end, sums[end] - sums[start]))
            start = end
    return stretches


def _run_slice(run: list[Task], plan: tuple, length: int) -> Slice:
    """One slice moving the whole requests of ``run`` (contiguous on both sides) in order."""
    local, peer, _, transport = plan
    request = run[0].request
    return Slice(run[0], 0, local, request.source - local.address, length, request.target_offset, peer,
                 transport, tuple(run[1:]))
