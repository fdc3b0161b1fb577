"""Moving objects' bytes between a store client's registered memory and their replicas.

A move is (local address, replica, size). Memory this process can map it copies itself with
:mod:`store.segment_copy`, checksumming on the way: its own segment (looked up with no help from
the engine, the cheapest of all) and another process's segment on this host (whose region the
engine maps, :meth:`transfer.engine.TransferEngine.shared_views`). The engine moves the rest
(TCP, RDMA, GPU memory): a small total on the calling thread, a larger one as one engine batch,
during which the calling thread hashes what it can (the sources of writes, whose bytes do not
change while a put runs; each read's target once its bytes are in), so that checksums take
little time of their own.
"""

from __future__ import annotations

import xxhash

from store.objects import ReplicaDescriptor, ReplicaTier
from store.segment_copy import Copy, SegmentCopier
from store.segment_owner import SegmentOwner
from transfer.batch import OpCode, Status, TransferRequest, TransferStatus
from transfer.engine import TransferEngine
from transfer.errors import MooncakeError, TransferFailed, TransferTimeout

# A move this small runs on the calling thread when TCP reaches the replica: handing it to the
# engine's connection threads and waiting for them costs several times the move itself. Reads
# stay there up to 4 MiB, where the engine splits them over two links of the calling thread
# (transfer.tcp.transport.STRIPE_BYTES): p50 per read over loopback, inline vs a batch, 2 MiB
# 726 vs 926 us, 4 MiB 1438 vs 1545; writes are not split, and from 1 MiB a batch moved them as
# fast (1024 KiB 418 vs 413, 4 MiB mean 1634 vs 1405; /tmp/s21/stripe_ab3.py).
INLINE_BYTES = 1 << 20
INLINE_READ_BYTES = 4 << 20
_MEMORY = ReplicaTier.MEMORY.value

Move = tuple[int, ReplicaDescriptor, int]  # (local address, replica, size)


class ReplicaMover:
    def __init__(self, engine: TransferEngine, owner: SegmentOwner | None, copy_threads: int) -> None:
        """``owner``: the client's own segment, if it contributes one."""
        self.engine, self.owner = engine, owner
        self.copier = SegmentCopier(copy_threads)

    def close(self) -> None:
        self.copier.close()

    def move(self, opcode: OpCode, moves: list[Move], checksum: bool,
             local_views: list[memoryview | None] | None = None,
             ) -> tuple[list[MooncakeError | None], list[int | None]]:
        """Per move None or the error that ended it, and (with ``checksum``) the checksum of the
        bytes moved to or from host memory: taken on the way where this process copies them
        itself, else by the calling thread while the engine moves the rest; None for GPU memory.
        ``local_views``: per move the view of its local range that the caller already looked up
        (``engine.host_views``: None for GPU memory), so that it is not looked up twice."""
        errors: list[MooncakeError | None] = [None] * len(moves)
        digests: list[int | None] = [None] * len(moves)
        copies = self._own_copies(opcode, moves, local_views)
        requests: list[tuple[int, TransferRequest]] = []
        handles: dict[str, int] = {}  # a batch's replicas mostly share a few segments
        for n, (address, replica, size) in enumerate(moves):
            if size == 0 or n in copies:
                continue
            try:
                handle = handles.get(replica.segment_name)
                if handle is None:
                    handle = handles[replica.segment_name] = self.engine.open_segment(replica.segment_name)
            except MooncakeError as exc:
                errors[n] = exc
                continue
            requests.append((n, TransferRequest(opcode, address, handle, replica.address, size, replica.grant)))
        unshared: list[tuple[int, TransferRequest]] = []
        if requests:
            for (n, request), views in zip(requests, self.engine.shared_views([r for _, r in requests])):
                if views is None:
                    unshared.append((n, request))
                elif isinstance(views, MooncakeError):
                    errors[n] = views
                else:  # (local, remote): the target is the local side of a read
                    copies[n] = views if opcode == OpCode.READ else (views[1], views[0])
        if copies:
            try:
                for n, digest in zip(copies, self.copier.copy(list(copies.values()), checksum,
                                                              sources_fixed=opcode == OpCode.WRITE)):
                    digests[n] = digest
            except (ValueError, BufferError) as exc:  # the memory went away under us: not to retry
                for n in copies:
                    errors[n] = TransferFailed(f"copy within this process failed: {exc!r}")
        if unshared:
            views = None
            if checksum:  # GPU memory (a None view) is left to the caller
                views = local_views if local_views is not None else self._host_views(unshared)
            self._engine_move(unshared, errors, Digests(views, moves, digests))
        return errors, digests

    def _host_views(self, requests: list[tuple[int, TransferRequest]]) -> list[memoryview | None]:
        """Per move, the view of its local range (None for GPU memory, and for moves not in
        ``requests``)."""
        views: list[memoryview | None] = [None] * (max(n for n, _ in requests) + 1)
        try:
            found = self.engine.host_views([r.source for _, r in requests], [r.length for _, r in requests])
        except MooncakeError:
            return views  # an unregistered address: the engine reports it move by move
        for (n, _), view in zip(requests, found):
            views[n] = view
        return views

    def _own_copies(self, opcode: OpCode, moves: list[Move],
                    local_views: list[memoryview | None] | None) -> dict[int, Copy]:
        """Per move to or from our own segment (and host memory here), its copy (target, source),
        found with no look-up in the engine (beyond the local range's, unless the caller has it):
        the cheapest of all."""
        if self.owner is None:
            return {}
        segment_id = self.owner.segment.segment_id
        mine = [n for n, (_, replica, size) in enumerate(moves)
                if replica.segment_id == segment_id and size > 0 and replica.tier == _MEMORY]
        if not mine:
            return {}
        if local_views is not None:
            locals_ = [local_views[n] for n in mine]
        else:
            try:
                locals_ = self.engine.host_views([moves[n][0] for n in mine], [moves[n][2] for n in mine])
            except MooncakeError:
                return {}  # an unregistered address: the engine reports it move by move
        remotes = self.owner.views([moves[n][1].address for n in mine], [moves[n][2] for n in mine])
        reading = opcode == OpCode.READ
        # Where either side is None: GPU memory, or a drained segment.
        return {n: (local, remote) if reading else (remote, local)
                for n, local, remote in zip(mine, locals_, remotes) if local is not None and remote is not None}

    def _engine_move(self, requests: list[tuple[int, TransferRequest]],
                     errors: list[MooncakeError | None], digests: Digests) -> None:
        """Move ``requests`` (each with its move's index) through the engine, recording each
        failure in ``errors``: on the calling thread when small, else as one engine batch. The
        calling thread hashes meanwhile (``digests``): a write's source before a small move or
        while the batch moves (the bytes of a put do not change while it runs), a read's target
        once its bytes are in, while the rest of the batch still moves."""
        reading = requests[0][1].opcode == OpCode.READ
        if sum(r.length for _, r in requests) <= (INLINE_READ_BYTES if reading else INLINE_BYTES):
            if not reading:
                digests.take([n for n, _ in requests])
            outcomes = self.engine.transfer_now_many([r for _, r in requests])
            for (n, _), outcome in zip(requests, outcomes):
                if isinstance(outcome, MooncakeError):
                    errors[n] = outcome
            if reading:
                digests.take([n for (n, _), outcome in zip(requests, outcomes) if outcome is True])
            requests = [moved for moved, outcome in zip(requests, outcomes) if outcome is False]
            if not requests:
                return
        batch = self.engine.allocate_batch_id(len(requests))
        try:
            self.engine.submit_transfer(batch, [r for _, r in requests])
            if not reading:
                digests.take([n for n, _ in requests])
            elif digests.views is not None:
                for k, (n, _) in enumerate(requests):
                    if self.engine.wait_request(batch, k).status == Status.COMPLETED:
                        digests.take([n])
            self.engine.wait_batch(batch)
            for k, (n, _) in enumerate(requests):
                status = self.engine.get_transfer_status(batch, k)
                if status.status != Status.COMPLETED:
                    errors[n] = _transfer_error(status)
                    digests.drop(n)
        except MooncakeError as exc:
            for n, _ in requests:
                errors[n] = errors[n] or exc
        finally:
            try:
                self.engine.free_batch_id(batch)
            except MooncakeError:
                pass  # still pending past its deadline: the engine reports it TIMEOUT anyway


class Digests:
    """Fills ``digests`` (per move) with the checksum of each move's local bytes in host memory
    (``views``: per move its local view, None for GPU memory; no views: nothing is hashed),
    hashing each source range once (an object written to several replicas is one source)."""

    def __init__(self, views: list[memoryview | None] | None, moves: list[Move],
                 digests: list[int | None]) -> None:
        self.views, self.moves, self.digests = views, moves, digests
        self._taken: dict[tuple[int, int], int] = {}

    def take(self, indexes: list[int]) -> None:
        if self.views is None:
            return
        for n in indexes:
            view = self.views[n]
            if view is None:
                continue
            source = (self.moves[n][0], self.moves[n][2])
            digest = self._taken.get(source)
            if digest is None:
                digest = self._taken[source] = xxhash.xxh3_64_intdigest(view)
            self.digests[n] = digest

    def drop(self, n: int) -> None:
        """Move ``n`` failed: what was hashed of its target is no object's bytes."""
        self.digests[n] = None


def _transfer_error(status: TransferStatus) -> MooncakeError:
    cls = TransferTimeout if status.status == Status.TIMEOUT else TransferFailed
    return cls(status.error or status.status.name)

