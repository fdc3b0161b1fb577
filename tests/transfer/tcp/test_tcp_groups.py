"""The TCP wire's request groups: mixed READs and WRITEs, refused ranges and many slices on one
connection, each request answered on its own."""

from __future__ import annotations

import time

import numpy as np

from transfer.batch import OpCode, Status, TransferRequest

KiB, MiB = 1 << 10, 1 << 20


def test_a_group_mixing_reads_writes_and_refused_ranges_answers_each_request(make_engine):
    options = dict(protocol="tcp", streams_per_path=1, slice_size=64 * KiB, slice_threshold=64 * KiB)
    target, initiator = make_engine(**options), make_engine(**options)
    remote = target.allocate_shared_buffer(8 * MiB)
    remote[:] = np.random.default_rng(3).integers(0, 256, len(remote), dtype=np.uint8)
    original = remote.copy()
    gone = np.zeros(MiB, np.uint8)
    target.register_local_memory(gone)
    handle = initiator.open_segment(target.name)  # caches a descriptor that still lists `gone`
    target.unregister_local_memory(gone, update_metadata=False)
    buffers = {b.length: b.address for b in initiator.segment_descriptor(handle).buffers}
    base, stale = buffers[8 * MiB], buffers[MiB]

    data = np.random.default_rng(4).integers(0, 256, 4 * MiB, dtype=np.uint8)
    back = np.zeros(4 * MiB, np.uint8)
    scratch = np.zeros(MiB, np.uint8)
    source, sink = initiator.register_local_memory(data), initiator.register_local_memory(back)
    spare = initiator.register_local_memory(scratch)
    requests, refused, moved = [], [], []  # moved: (opcode, offset, size) of the good ones
    offsets = {OpCode.WRITE: 0, OpCode.READ: 0}
    for i in range(300):  # more than one group; 2 KiB requests and two-slice 100 KiB ones
        opcode = OpCode.WRITE if i % 2 else OpCode.READ
        size = 100 * KiB if i % 7 == 0 else 2 * KiB
        offset = offsets[opcode]
        offsets[opcode] += size
        local = source if opcode == OpCode.WRITE else sink
        remote_at = base + offset + (0 if opcode == OpCode.WRITE else 4 * MiB)
        requests.append(TransferRequest(opcode, local + offset, handle, remote_at, size))
        moved.append((opcode, offset, size))
        if i % 50 == 25:  # a range the target no longer serves, between good ones
            refused.append(len(requests))
            requests.append(TransferRequest(OpCode.WRITE if i % 100 == 25 else OpCode.READ,
                                            spare, handle, stale, 100 * KiB))
    assert max(offsets.values()) <= 4 * MiB

    batch = initiator.allocate_batch_id(len(requests))
    initiator.submit_transfer(batch, requests)
    deadline = time.monotonic() + 20  # wait_batch returns at the first failure: wait for all
    while True:
        statuses = [initiator.get_transfer_status(batch, i).status for i in range(len(requests))]
        if Status.PENDING not in statuses or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert [i for i, s in enumerate(statuses) if s != Status.COMPLETED] == refused
    assert all(statuses[i] == Status.FAILED for i in refused)
    initiator.free_batch_id(batch)

    expected = original.copy()
    for opcode, offset, size in moved:
        if opcode == OpCode.WRITE:
            expected[offset:offset + size] = data[offset:offset + size]
        else:
            assert np.array_equal(back[offset:offset + size], original[4 * MiB + offset:4 * MiB + offset + size])
    assert np.array_equal(remote, expected)
    assert not scratch.any()
