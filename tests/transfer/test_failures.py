"""Faults: a target killed or frozen mid-batch, a peer restarted under the same name."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from transfer.batch import OpCode, Status, TransferRequest
from transfer.metadata.table import MetadataTable

MiB = 1 << 20
FAST_FAIL = dict(protocol="tcp", transfer_timeout=4.0, slice_timeout=1.0, handshake_timeout=1.0,
                 retry_count=2, slice_size=256 * 1024, path_cooldown=0.2)


def _big_batch(initiator, target, count=32, size=2 * MiB):
    data = np.ones(count * size, np.uint8)
    source = initiator.register_local_memory(data)
    handle = initiator.open_segment(target.name)
    batch = initiator.allocate_batch_id(count)
    initiator.submit_transfer(batch, [
        TransferRequest(OpCode.WRITE, source + i * size, handle, target.address + i * size, size)
        for i in range(count)])
    return batch


def test_target_killed_mid_batch_ends_every_request_and_the_engine_keeps_working(
        make_engine, target_process):
    target = target_process(64 * MiB)
    initiator = make_engine(**FAST_FAIL)
    batch = _big_batch(initiator, target)
    time.sleep(0.05)
    os.kill(target.pid, signal.SIGKILL)
    started = time.monotonic()
    status = initiator.wait_batch(batch, timeout=10)
    assert time.monotonic() - started < FAST_FAIL["transfer_timeout"] + 2
    finals = [initiator.get_transfer_status(batch, i).status for i in range(32)]
    assert Status.PENDING not in finals and status.status in (Status.FAILED, Status.TIMEOUT, Status.COMPLETED)
    initiator.free_batch_id(batch)

    other = make_engine(protocol="tcp")
    remote = other.allocate_shared_buffer(MiB)
    local = np.full(MiB, 3, np.uint8)
    initiator.write(other.name, initiator.register_local_memory(local),
                    initiator.segment_descriptor(other.name).buffers[0].address, MiB)
    assert (remote == 3).all()


def test_frozen_target_times_out_within_the_deadline(make_engine, target_process):
    target = target_process(64 * MiB)
    initiator = make_engine(**FAST_FAIL)
    initiator.open_segment(target.name)  # handshake while it still answers
    os.kill(target.pid, signal.SIGSTOP)
    try:
        batch = _big_batch(initiator, target)
        started = time.monotonic()
        status = initiator.wait_batch(batch, timeout=10)
        assert time.monotonic() - started < FAST_FAIL["transfer_timeout"] + 2
        assert status.status in (Status.FAILED, Status.TIMEOUT)
    finally:
        os.kill(target.pid, signal.SIGCONT)


def test_restarted_peer_invalidates_the_cached_descriptor(make_engine):
    table = MetadataTable()
    for protocol in ("shm", "tcp"):
        initiator = make_engine(metadata=table, protocol=protocol, **{
            k: v for k, v in FAST_FAIL.items() if k != "protocol"})
        local = np.full(4096, 5, np.uint8)
        source = initiator.register_local_memory(local)
        old = make_engine(metadata=table, protocol=protocol, name="restarting")
        old.allocate_shared_buffer(MiB)
        old_address = initiator.segment_descriptor("restarting").buffers[0].address
        old.close()
        new = make_engine(metadata=table, protocol=protocol, name="restarting")
        remote = new.allocate_shared_buffer(MiB)
        try:
            initiator.write("restarting", source, old_address, 4096)
            raise AssertionError("a write to the dead incarnation must fail")
        except Exception as exc:
            assert getattr(exc, "code", None) in (-800, -801)
        new_address = initiator.segment_descriptor("restarting").buffers[0].address
        initiator.write("restarting", source, new_address, 4096)
        assert (remote[:4096] == 5).all()


def test_shm_copy_releases_the_gil(make_engine):
    target, initiator = make_engine(protocol="shm"), make_engine(protocol="shm")
    remote = target.allocate_shared_buffer(64 * MiB)
    data = np.ones(64 * MiB, np.uint8)
    source = initiator.register_local_memory(data)
    address = initiator.segment_descriptor(target.name).buffers[0].address
    spins, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            spins[0] += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        for _ in range(3):
            initiator.write(target.name, source, address, len(data))
    finally:
        stop.set()
        thread.join()
    assert remote.all() and spins[0] > 1000  # the spinner ran while copies were under way
