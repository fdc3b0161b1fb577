"""Two engines in this process moving real bytes over TCP and shared memory."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from transfer.batch import OpCode, Status, TransferRequest, TransferStatus
from transfer.errors import (AddressNotRegistered, AddressOverlapped, BatchBusy, InvalidArgument, TransferFailed,
                             SegmentNotFound, TooManyRequests)
from transfer.memory import address_of

MiB = 1 << 20


def _pair(make_engine, **options):
    target, initiator = make_engine(**options), make_engine(**options)
    remote = target.allocate_shared_buffer(8 * MiB)
    handle = initiator.open_segment(target.name)
    return target, initiator, remote, handle


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_write_then_read_round_trips_multi_slice_requests(make_engine, protocol):
    target, initiator, remote, handle = _pair(make_engine, protocol=protocol, slice_size=256 * 1024)
    data = np.random.default_rng(1).integers(0, 256, 3 * MiB + 12345, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    base = initiator.segment_descriptor(handle).buffers[0].address
    assert initiator.write(handle, source, base + 100, len(data)) == len(data)
    assert np.array_equal(remote[100:100 + len(data)], data)
    back = np.zeros_like(data)
    initiator.register_local_memory(back)
    assert initiator.read(handle, address_of(back), base + 100, len(data)) == len(data)
    assert np.array_equal(back, data)


def test_batch_statuses_and_free(make_engine):
    target, initiator, remote, handle = _pair(make_engine, protocol="tcp")
    local = bytearray(b"x" * 4096)
    source = initiator.register_local_memory(local)
    base = initiator.segment_descriptor(handle).buffers[0].address
    batch = initiator.allocate_batch_id(4)
    requests = [TransferRequest(OpCode.WRITE, source + i * 1024, handle, base + i * 1024, 1024)
                for i in range(4)]
    initiator.submit_transfer(batch, requests)
    status = initiator.wait_batch(batch)
    assert status.status == Status.COMPLETED and status.transferred_bytes == 4096
    assert initiator.get_transfer_status(batch, 3).status == Status.COMPLETED
    assert bytes(remote[:4096]) == bytes(local)
    with pytest.raises(TooManyRequests):
        initiator.submit_transfer(batch, requests[:1])  # capacity 4 already used
    initiator.free_batch_id(batch)
    with pytest.raises(InvalidArgument):
        initiator.get_batch_transfer_status(batch)


def test_free_batch_is_refused_while_a_request_is_pending(make_engine):
    target, initiator, remote, handle = _pair(make_engine, protocol="tcp")
    data = np.ones(8 * MiB, np.uint8)
    source = initiator.register_local_memory(data)
    base = initiator.segment_descriptor(handle).buffers[0].address
    batch = initiator.allocate_batch_id(1)
    initiator.submit_transfer(batch, [TransferRequest(OpCode.WRITE, source, handle, base, len(data))])
    if initiator.get_batch_transfer_status(batch).status == Status.PENDING:
        with pytest.raises(BatchBusy):
            initiator.free_batch_id(batch)
    assert initiator.wait_batch(batch).status == Status.COMPLETED
    initiator.free_batch_id(batch)


def test_torch_tensor_and_bytearray_are_registrable(make_engine):
    target, initiator, remote, handle = _pair(make_engine, protocol="auto")
    tensor = torch.arange(1024, dtype=torch.float32)
    source = initiator.register_local_memory(tensor)
    base = initiator.segment_descriptor(handle).buffers[0].address
    initiator.write(handle, source, base, tensor.numel() * 4)
    assert np.array_equal(remote[:4096].view(np.float32), tensor.numpy())
    with pytest.raises(AddressOverlapped):
        initiator.register_local_memory(tensor[10:20])
    initiator.unregister_local_memory(tensor)
    with pytest.raises(AddressNotRegistered):
        initiator.unregister_local_memory(source)
    with pytest.raises(InvalidArgument):
        initiator.register_local_memory(b"read-only bytes")


def test_bad_input_raises_typed_errors_and_writes_nothing(make_engine):
    # handshake_timeout: the unknown peer below costs one whole handshake deadline.
    target, initiator, remote, handle = _pair(make_engine, protocol="tcp", handshake_timeout=1.0)
    local = np.full(4096, 9, np.uint8)
    source = initiator.register_local_memory(local)
    base = initiator.segment_descriptor(handle).buffers[0].address
    good = TransferRequest(OpCode.WRITE, source, handle, base, 1024)
    bad = {
        AddressNotRegistered: TransferRequest(OpCode.WRITE, source + 4000, handle, base, 1024),
        InvalidArgument: TransferRequest(OpCode.WRITE, source, handle, base + 8 * MiB - 10, 1024),
        SegmentNotFound: TransferRequest(OpCode.WRITE, source, 999, base, 1024),
    }
    batch = initiator.allocate_batch_id(8)
    for error, request in bad.items():
        with pytest.raises(error):
            initiator.submit_transfer(batch, [good, request])  # the good one must not move either
    for length in (0, -5):
        with pytest.raises(InvalidArgument):
            initiator.submit_transfer(batch, [TransferRequest(OpCode.WRITE, source, handle, base, length)])
    with pytest.raises(TooManyRequests):
        initiator.submit_transfer(initiator.allocate_batch_id(1), [good, good])
    with pytest.raises(SegmentNotFound):
        initiator.open_segment("127.0.0.1:1")
    assert initiator.get_batch_transfer_status(batch).transferred_bytes == 0
    assert not remote.any()


def test_striping_uses_several_streams_and_a_small_pool_evicts(make_engine):
    target, initiator, remote, handle = _pair(
        make_engine, protocol="tcp", slice_size=64 * 1024, streams_per_path=4, endpoint_pool_size=2)
    data = np.random.default_rng(2).integers(0, 256, 2 * MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    base = initiator.segment_descriptor(handle).buffers[0].address
    initiator.write(handle, source, base, len(data))
    assert np.array_equal(remote[:len(data)], data)
    tcp = next(t for t in initiator.transports if t.name == "tcp")
    assert tcp.num_connections() == 2 and tcp.num_evicted >= 2


def test_metadata_served_by_a_master_table(make_engine):
    from transfer.metadata.table import MetadataTable

    table = MetadataTable()
    target = make_engine(metadata=table, protocol="shm")
    initiator = make_engine(metadata=table, protocol="shm")
    remote = target.allocate_shared_buffer(MiB)
    local = np.arange(256, dtype=np.uint8)
    initiator.write(target.name, initiator.register_local_memory(local),
                    initiator.segment_descriptor(target.name).buffers[0].address, 256)
    assert np.array_equal(remote[:256], local)
    assert table.get(target.name).version == target.version


def test_transfer_now_many_moves_each_request_between_the_right_buffers(make_engine):
    """Requests alternating between two local buffers and two segments land where they should:
    the lookups one call shares must never hand a request another's buffer."""
    targets = [make_engine(protocol="shm") for _ in range(2)]
    initiator = make_engine(protocol="shm")
    remotes = [t.allocate_shared_buffer(1 * MiB) for t in targets]
    handles = [initiator.open_segment(t.name) for t in targets]
    bases = [initiator.segment_descriptor(h).buffers[0].address for h in handles]
    locals_ = [np.random.default_rng(n).integers(0, 256, 64 * 1024, dtype=np.uint8) for n in range(2)]
    sources = [initiator.register_local_memory(a) for a in locals_]
    requests, expected = [], []
    for i in range(16):
        side, target = i % 2, (i // 2) % 2
        requests.append(TransferRequest(OpCode.WRITE, sources[side] + i * 1024, handles[target],
                                        bases[target] + i * 4096, 1024))
        expected.append((target, i * 4096, locals_[side][i * 1024:(i + 1) * 1024]))
    unregistered = TransferRequest(OpCode.WRITE, 8, handles[0], bases[0], 1024)
    outcomes = initiator.transfer_now_many(requests[:8] + [unregistered] + requests[8:])
    assert outcomes[:8] + outcomes[9:] == [True] * 16
    assert isinstance(outcomes[8], AddressNotRegistered)
    [alone] = initiator.transfer_now_many([unregistered])  # one request takes its own path
    assert isinstance(alone, AddressNotRegistered)
    for target, offset, data in expected:
        assert np.array_equal(remotes[target][offset:offset + 1024], data)
    back = np.zeros(1024, np.uint8)
    into = initiator.register_local_memory(back)
    assert initiator.transfer_now_many([TransferRequest(OpCode.READ, into, handles[1], bases[1] + 2 * 4096, 1024)]) == [True]
    assert np.array_equal(back, expected[2][2])


def test_shared_views_hand_out_both_ends_of_shared_memory_requests_only(make_engine):
    """A caller that copies itself gets each shared-memory request's local and remote bytes; a
    request the engine must move (its peer reached over TCP) gets None, a bad one its error."""
    target, initiator, remote, handle = _pair(make_engine)
    local = np.arange(8192, dtype=np.uint64).view(np.uint8)[:8192].copy()
    source = initiator.register_local_memory(local)
    base = initiator.segment_descriptor(handle).buffers[0].address
    requests = [TransferRequest(OpCode.WRITE, source + 100, handle, base + 5000, 3000),
                TransferRequest(OpCode.WRITE, 8, handle, base, 1024)]
    (ours, theirs), error = initiator.shared_views(requests)
    assert isinstance(error, AddressNotRegistered)
    theirs[:] = ours
    assert np.array_equal(remote[5000:8000], local[100:3100])
    # A single request is planned on its own, to the same bytes and the same refusal.
    [(ours_alone, theirs_alone)] = initiator.shared_views(requests[:1])
    assert bytes(ours_alone) == bytes(ours) and bytes(theirs_alone) == remote[5000:8000].tobytes()
    [error_alone] = initiator.shared_views(requests[1:])
    assert isinstance(error_alone, AddressNotRegistered)

    tcp_target, tcp_initiator, _, tcp_handle = _pair(make_engine, protocol="tcp")
    tcp_source = tcp_initiator.register_local_memory(np.ones(4096, np.uint8))
    tcp_base = tcp_initiator.segment_descriptor(tcp_handle).buffers[0].address
    assert tcp_initiator.shared_views([TransferRequest(OpCode.READ, tcp_source, tcp_handle, tcp_base, 4096)]) == [None]


def test_transfer_now_many_moves_tcp_requests_on_the_callers_thread(make_engine):
    target, initiator, remote, handle = _pair(make_engine, protocol="tcp")
    local = np.ones(4096, np.uint8)
    source = initiator.register_local_memory(local)
    base = initiator.segment_descriptor(handle).buffers[0].address
    assert initiator.transfer_now_many([TransferRequest(OpCode.WRITE, source, handle, base, 4096)]) == [True]
    assert (remote[:4096] == 1).all()


def test_a_large_read_on_the_callers_thread_is_split_over_two_links(make_engine):
    """Reads of STRIPE_BYTES or more go as halves over two of the thread's links: every byte
    lands where its request said, each request keeps its own outcome (a half the target
    refuses fails the request it belongs to), and writes stay on one link."""
    from transfer.tcp import transport as tcp

    target, initiator, remote, handle = _pair(make_engine, protocol="tcp")
    remote[:] = np.random.default_rng(3).integers(0, 256, len(remote), dtype=np.uint8)
    base = initiator.segment_descriptor(handle).buffers[0].address
    back = np.zeros(3 * MiB, np.uint8)
    into = initiator.register_local_memory(back)
    sizes = [MiB + 4097, 300 * 1024, MiB]
    offsets = [0, sizes[0], sizes[0] + sizes[1]]
    requests = [TransferRequest(OpCode.READ, into + offset, handle, base + 2 * offset + 8, size)
                for offset, size in zip(offsets, sizes)]
    links = initiator.transports[0]._links  # the TCP transport's, per (thread, peer, NIC, stripe)
    assert initiator.transfer_now_many(requests) == [True] * 3
    for offset, size in zip(offsets, sizes):
        assert np.array_equal(back[offset:offset + size], remote[2 * offset + 8:2 * offset + 8 + size])
    assert sorted(key[-1] for key in links) == [0, 1]

    # A buffer the target dropped after the initiator learnt of it: its read is refused there.
    dropped = np.zeros(MiB, np.uint8)
    dropped_at = target.register_local_memory(dropped)
    initiator.sync_segment_cache(target.name)
    target.unregister_local_memory(dropped_at, update_metadata=False)
    outcomes = initiator.transfer_now_many([TransferRequest(OpCode.READ, into + MiB, handle, base, MiB),
                                            TransferRequest(OpCode.READ, into, handle, dropped_at, MiB)])
    assert outcomes[0] is True and isinstance(outcomes[1], TransferFailed)
    assert np.array_equal(back[MiB:2 * MiB], remote[:MiB])

    moves = [(OpCode.READ, memoryview(back)[:MiB], base, b""), (OpCode.READ, memoryview(back)[MiB:MiB + 10], base, b"")]
    parts = tcp._stripes(moves, 2)
    half = (MiB + 10) // 2
    assert [sum(len(m[1]) for m in part) for part in parts] == [half, half]
    assert parts[1][0][2] == base + half  # the cut move's second piece goes on where the first ended
    assert tcp._joined(moves, parts, [[0], [0, -7]]) == [0, -7]
    writes = [(OpCode.WRITE, memoryview(back)[:2 * MiB], base, b"")]
    assert tcp._stripes(writes, 2) == [writes]


def _recorded_shm_copies(monkeypatch, run_bytes: int = 0, long_run_bytes: int = 0) -> list[int]:
    """The length of every copy the shared-memory transport makes from now on, in order;
    with ``run_bytes`` and ``long_run_bytes`` its run limits scaled down to them."""
    from transfer import batches
    from transfer.shm import transport as shm

    copies: list[int] = []
    real_copy = shm._copy
    monkeypatch.setattr(shm, "_copy",
                        lambda op, local, remote: copies.append(local.nbytes) or real_copy(op, local, remote))
    if run_bytes:
        for module in (shm, batches):
            monkeypatch.setattr(module, "RUN_BYTES", run_bytes)
    if long_run_bytes:
        monkeypatch.setattr(shm, "LONG_RUN_BYTES", long_run_bytes)
    return copies


def test_shm_copies_requests_that_continue_each_other_as_one_run(make_engine, monkeypatch):
    """A batch of small contiguous requests becomes a few large copies; requests that do not
    continue the previous one (a gap, the other local buffer, the other direction) start a new
    run, and every byte lands where its own request said."""
    copies = _recorded_shm_copies(monkeypatch)
    target, initiator, remote, handle = _pair(make_engine, protocol="shm", shm_copy_threads=1)
    base = initiator.segment_descriptor(handle).buffers[0].address
    rng = np.random.default_rng(7)
    first, second = (rng.integers(0, 256, 256 * 1024, dtype=np.uint8) for _ in range(2))
    sources = [initiator.register_local_memory(a) for a in (first, second)]
    block = 4096
    requests = [TransferRequest(OpCode.WRITE, sources[0] + i * block, handle, base + i * block, block)
                for i in range(32)]  # one run
    requests += [TransferRequest(OpCode.WRITE, sources[0] + (32 + i) * block, handle, base + (40 + i) * block,
                                 block) for i in range(8)]  # a gap on the remote side: a second run
    requests += [TransferRequest(OpCode.WRITE, sources[1] + i * block, handle, base + (48 + i) * block,
                                 block) for i in range(8)]  # continues remotely, from the other local buffer: a third
    batch = initiator.allocate_batch_id(len(requests))
    initiator.submit_transfer(batch, requests)
    assert initiator.wait_batch(batch).status == Status.COMPLETED
    initiator.free_batch_id(batch)
    assert np.array_equal(remote[:32 * block], first[:32 * block])
    assert np.array_equal(remote[40 * block:48 * block], first[32 * block:40 * block])
    assert np.array_equal(remote[48 * block:56 * block], second[:8 * block])
    assert sorted(copies) == [8 * block, 8 * block, 32 * block]
    back = np.zeros(16 * block, np.uint8)
    into = initiator.register_local_memory(back)
    copies.clear()
    assert initiator.read(handle, into, base + 36 * block, 16 * block) == 16 * block  # one request, one copy
    assert np.array_equal(back[4 * block:12 * block], first[32 * block:40 * block])
    assert copies == [16 * block]


def _writes(source: int, handle, base: int, block: int, local_block: int, remote_block: int,
            count: int) -> list[TransferRequest]:
    """``count`` WRITEs of ``block`` bytes, laid end to end on both sides from the given blocks."""
    return [TransferRequest(OpCode.WRITE, source + (local_block + i) * block, handle,
                            base + (remote_block + i) * block, block) for i in range(count)]


def test_a_batch_within_one_buffer_moves_in_runs_and_each_request_ends_on_its_own_account(make_engine, monkeypatch):
    """Contiguous requests inside one local and one peer buffer (KV pages) are planned as a
    whole and moved as runs of at most RUN_BYTES; each request still reports its own status
    and bytes, and when a run cannot be moved every request it carried fails at once."""
    copies = _recorded_shm_copies(monkeypatch, run_bytes=256 * 1024)
    target, initiator, remote, handle = _pair(make_engine, protocol="shm", shm_copy_threads=1)
    base = initiator.segment_descriptor(handle).buffers[0].address
    data = np.random.default_rng(3).integers(0, 256, 2 * MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    block = 32 * 1024
    requests = _writes(source, handle, base, block, 0, 0, 12)  # 384 KiB: a run of 256 KiB and one of 128 KiB
    requests += _writes(source, handle, base, block, 12, 20, 12)  # after a gap on the remote side: the same again
    batch = initiator.allocate_batch_id(len(requests))
    initiator.submit_transfer(batch, requests)
    status = initiator.wait_batch(batch)
    assert (status.status, status.transferred_bytes) == (Status.COMPLETED, 24 * block)
    assert all(initiator.get_transfer_status(batch, i) == TransferStatus(Status.COMPLETED, block)
               for i in range(len(requests)))
    initiator.free_batch_id(batch)
    assert sorted(copies) == [128 * 1024, 128 * 1024, 256 * 1024, 256 * 1024]
    assert np.array_equal(remote[:12 * block], data[:12 * block])
    assert np.array_equal(remote[20 * block:32 * block], data[12 * block:24 * block])

    target.close()  # its region is removed: the next runs cannot be mapped
    batch = initiator.allocate_batch_id(len(requests))
    started = time.monotonic()
    initiator.submit_transfer(batch, requests)
    status = initiator.wait_batch(batch)
    assert time.monotonic() - started < 5  # not the 10 s deadline of requests nobody ended
    assert status.status == Status.FAILED and "cannot map" in status.error
    assert {initiator.get_transfer_status(batch, i).status for i in range(len(requests))} == {Status.FAILED}
    initiator.free_batch_id(batch)


def test_a_long_stretch_moves_in_long_runs_and_a_short_one_in_short_runs(make_engine, monkeypatch):
    """A stretch of contiguous requests at least LONG_RUN_BYTES long is copied in runs that
    long (memcpy's non-temporal stores start past tens of MiB); a shorter one in runs of
    RUN_BYTES, spread over the copy threads. Every byte lands where its request says."""
    copies = _recorded_shm_copies(monkeypatch, run_bytes=128 * 1024, long_run_bytes=512 * 1024)
    target, initiator, remote, handle = _pair(make_engine, protocol="shm", shm_copy_threads=2)
    base = initiator.segment_descriptor(handle).buffers[0].address
    data = np.random.default_rng(4).integers(0, 256, 2 * MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    block = 64 * 1024
    requests = _writes(source, handle, base, block, 0, 0, 20)  # 1.25 MiB: two long runs and one short
    requests += _writes(source, handle, base, block, 20, 24, 6)  # after a gap on the remote side, 384 KiB: three short runs
    batch = initiator.allocate_batch_id(len(requests))
    initiator.submit_transfer(batch, requests)
    assert initiator.wait_batch(batch).status == Status.COMPLETED
    assert all(initiator.get_transfer_status(batch, i) == TransferStatus(Status.COMPLETED, block)
               for i in range(len(requests)))
    initiator.free_batch_id(batch)
    assert sorted(copies) == [128 * 1024] * 3 + [256 * 1024] + [512 * 1024] * 2
    assert np.array_equal(remote[:20 * block], data[:20 * block])
    assert np.array_equal(remote[24 * block:30 * block], data[20 * block:26 * block])
    assert not remote[20 * block:24 * block].any()


def test_tcp_sends_contiguous_small_requests_as_slice_sized_runs_unless_they_carry_grants(make_engine, monkeypatch):
    """Over TCP a run of whole requests goes as one slice of up to the slice size (one header
    and one completion instead of one per request); each request still ends on its own
    account. Requests carrying grants go one by one: a peer checks each slice against its own
    request's grant."""
    from transfer.tcp.transport import TcpTransport

    submitted = []
    real_submit = TcpTransport.submit
    monkeypatch.setattr(TcpTransport, "submit",
                        lambda self, pieces: submitted.append(len(pieces)) or real_submit(self, pieces))
    target, initiator, remote, handle = _pair(make_engine, protocol="tcp", slice_size=256 * 1024)
    base = initiator.segment_descriptor(handle).buffers[0].address
    data = np.random.default_rng(5).integers(0, 256, MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    block = 32 * 1024
    for grant, slices in ((b"", 3), (b"a grant", 24)):
        submitted.clear()
        remote[:] = 0
        requests = [TransferRequest(OpCode.WRITE, source + i * block, handle, base + i * block, block, grant)
                    for i in range(24)]  # 768 KiB: three runs of 256 KiB
        batch = initiator.allocate_batch_id(len(requests))
        initiator.submit_transfer(batch, requests)
        assert initiator.wait_batch(batch) == TransferStatus(Status.COMPLETED, 24 * block)
        assert all(initiator.get_transfer_status(batch, i) == TransferStatus(Status.COMPLETED, block)
                   for i in range(len(requests)))
        initiator.free_batch_id(batch)
        assert sum(submitted) == slices
        assert np.array_equal(remote[:24 * block], data[:24 * block])
    back = np.zeros(24 * block, np.uint8)
    into = initiator.register_local_memory(back)
    batch = initiator.allocate_batch_id(24)
    initiator.submit_transfer(batch, [TransferRequest(OpCode.READ, into + i * block, handle, base + i * block, block)
                                      for i in range(24)])
    assert initiator.wait_batch(batch).status == Status.COMPLETED
    assert np.array_equal(back, data[:24 * block])


@pytest.mark.parametrize("opcode", [OpCode.WRITE, OpCode.READ])
def test_a_batch_within_one_buffer_gets_its_shared_views_and_moves_in_one_pass(make_engine, opcode):
    """A batch in one local and one peer buffer (a store batch's objects) is planned once: every
    request still gets its own two views and its bytes land where it said, in either direction,
    and when the peer's memory is gone every request gets the error."""
    target, initiator, remote, handle = _pair(make_engine, protocol="shm")
    base = initiator.segment_descriptor(handle).buffers[0].address
    local = np.random.default_rng(11).integers(0, 256, 256 * 1024, dtype=np.uint8)
    remote[:256 * 1024] = np.random.default_rng(12).integers(0, 256, 256 * 1024, dtype=np.uint8)
    source = initiator.register_local_memory(local)
    # Scattered on the peer side, in reverse order, of several sizes: no run, one plan.
    requests = [TransferRequest(opcode, source + i * 8192, handle, base + (31 - i) * 8192 + 7, 1000 + i)
                for i in range(32)]
    views = initiator.shared_views(requests)
    for i, (ours, theirs) in enumerate(views):
        assert bytes(ours) == local[i * 8192:i * 8192 + 1000 + i].tobytes()
        assert bytes(theirs) == remote[(31 - i) * 8192 + 7:(31 - i) * 8192 + 1007 + i].tobytes()
    expected_remote, expected_local = remote.copy(), local.copy()
    for i in range(32):
        mine, theirs = slice(i * 8192, i * 8192 + 1000 + i), slice((31 - i) * 8192 + 7, (31 - i) * 8192 + 1007 + i)
        if opcode == OpCode.WRITE:
            expected_remote[theirs] = local[mine]
        else:
            expected_local[mine] = remote[theirs]
    assert initiator.transfer_now_many(requests) == [True] * 32
    assert np.array_equal(remote, expected_remote) and np.array_equal(local, expected_local)

    target.close()
    outcomes = initiator.shared_views(requests) if opcode == OpCode.READ else initiator.transfer_now_many(requests)
    assert len(outcomes) == 32 and all(isinstance(o, TransferFailed) and "cannot map" in str(o) for o in outcomes)
