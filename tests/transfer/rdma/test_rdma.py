"""The RDMA transport end to end against the stand-in verbs: engines, handshake, WRs, retries."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tests.transfer.rdma.fake_verbs import Fabric, FakeVerbs

from transfer.batch import OpCode, Status, TransferRequest
from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.memory import address_of

KiB, MiB = 1 << 10, 1 << 20
TWO_NICS = {"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:0": [["mlx5_1"], ["mlx5_0"]]}


@pytest.fixture
def fabric():
    return Fabric()


@pytest.fixture
def rdma_engines(fabric):
    """(initiator, target) on the fabric, protocol=rdma, two devices each; closed afterwards."""
    engines = []

    def make(topology=TWO_NICS, target_mtu=4096, **options):
        settings = {"protocol": "rdma", "transfer_timeout": 10.0, "path_cooldown": 60.0, **options}
        for host, mtu in (("a", 4096), ("b", target_mtu)):
            engines.append(TransferEngine(
                options=EngineOptions(**settings), topology=topology,
                verbs=FakeVerbs(fabric, host, ["mlx5_0", "mlx5_1"], mtu=mtu), gpudirect=False))
        return engines[-2], engines[-1]

    yield make
    for engine in engines:
        engine.close()


def _target_buffer(target, size=8 * MiB):
    memory = np.zeros(size, np.uint8)
    target.register_local_memory(memory)
    return memory, address_of(memory)


def test_write_and_read_move_bytes_as_64k_work_requests(fabric, rdma_engines):
    initiator, target = rdma_engines()
    remote, base = _target_buffer(target)
    data = np.random.default_rng(7).integers(0, 256, 2 * MiB + 10 * KiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    handle = initiator.open_segment(target.name)
    assert initiator.write(handle, source, base + 4096, len(data)) == len(data)
    assert np.array_equal(remote[4096:4096 + len(data)], data)
    # Engine slices of 1 MiB and 1 MiB + 10 KiB (a short tail joins the slice before it); the
    # RDMA transport posts each as 64 KiB requests, its 10 KiB tail again merged (< 16 KiB).
    lengths = sorted(length for host, _, length in fabric.posts if host == "a")
    assert lengths == [64 * KiB] * 31 + [74 * KiB]
    back = np.zeros_like(data)
    initiator.register_local_memory(back)
    assert initiator.read(handle, address_of(back), base + 4096, len(data)) == len(data)
    assert np.array_equal(back, data)


def test_device_choice_follows_the_matrix_for_the_buffer_location(fabric, rdma_engines):
    initiator, target = rdma_engines()
    remote, base = _target_buffer(target)
    on_cpu, on_gpu_side = np.ones(256 * KiB, np.uint8), np.full(256 * KiB, 2, np.uint8)
    initiator.register_local_memory(on_cpu, "cpu:0")
    initiator.register_local_memory(on_gpu_side, "cuda:0")
    handle = initiator.open_segment(target.name)
    initiator.write(handle, address_of(on_cpu), base, len(on_cpu))
    assert {device for host, device, _ in fabric.posts if host == "a"} == {"mlx5_0"}
    fabric.posts.clear()
    initiator.write(handle, address_of(on_gpu_side), base, len(on_gpu_side))
    assert {device for host, device, _ in fabric.posts if host == "a"} == {"mlx5_1"}
    # The peer device comes from the target's matrix for *its* buffer (cpu:0 -> mlx5_0).
    qps = [qp for qp in fabric.qps.values() if qp.device.host == "b"]
    assert {qp.device.name for qp in qps} == {"mlx5_0"}


def test_handshake_exchanges_gid_lid_qpn_psn_and_the_smaller_mtu(fabric, rdma_engines):
    initiator, target = rdma_engines(target_mtu=1024, rdma_qps_per_endpoint=3)
    remote, base = _target_buffer(target)
    data = np.arange(100, dtype=np.uint8)
    initiator.register_local_memory(data)
    initiator.write(initiator.open_segment(target.name), address_of(data), base, 100)
    ours = [qp for qp in fabric.qps.values() if qp.device.host == "a"]
    theirs = {qp.qpn: qp for qp in fabric.qps.values() if qp.device.host == "b"}
    assert len(ours) == len(theirs) == 3
    for qp in ours:
        peer = theirs[qp.target.remote_qpn]
        assert peer.target.remote_qpn == qp.qpn
        assert (qp.target.local_psn, qp.target.remote_psn) == (peer.target.remote_psn, peer.target.local_psn)
        assert qp.target.remote_gid == peer.device.gid and qp.target.remote_lid == peer.device.lid
        assert qp.target.gid_index == 3  # the RoCEv2 GID, not the link-local one at index 0
        assert qp.target.mtu == peer.target.mtu == 1024
    assert np.array_equal(remote[:100], data)


def test_completions_are_reported_by_the_poller_thread(fabric, rdma_engines):
    initiator, target = rdma_engines()
    remote, base = _target_buffer(target)
    data = np.full(512 * KiB, 9, np.uint8)
    source = initiator.register_local_memory(data)
    handle = initiator.open_segment(target.name)
    reporters = []
    done = initiator.done
    initiator.done = lambda piece: (reporters.append(threading.current_thread().name), done(piece))
    fabric.hold.set()  # completions stay queued: the request must be PENDING, not blocking submit
    batch = initiator.allocate_batch_id(1)
    initiator.submit_transfer(batch, [TransferRequest(OpCode.WRITE, source, handle, base, len(data))])
    assert initiator.get_batch_transfer_status(batch).status == Status.PENDING
    fabric.hold.clear()
    assert initiator.wait_batch(batch, timeout=5).status == Status.COMPLETED
    assert reporters == ["rdma-poll"]
    assert np.array_equal(remote[:len(data)], data)


def test_a_failed_slice_moves_to_another_pair_and_the_endpoint_is_rebuilt(fabric, rdma_engines):
    initiator, target = rdma_engines()
    remote, base = _target_buffer(target)
    data = np.random.default_rng(3).integers(0, 256, 3 * MiB, dtype=np.uint8)
    source = initiator.register_local_memory(data)
    handle = initiator.open_segment(target.name)
    initiator.write(handle, source, base, 1024)  # endpoint a/mlx5_0 -> b/mlx5_0 is up
    rdma = initiator._rdma
    assert rdma.num_handshakes == 1
    fabric.broken.add(("a", "mlx5_0"))
    assert initiator.write(handle, source, base, len(data)) == len(data)
    assert np.array_equal(remote[:len(data)], data)
    used = {device for host, device, _ in fabric.posts if host == "a"}
    assert used == {"mlx5_0", "mlx5_1"}
    keys = {key[2:] for key in rdma._pool.keys()}  # noqa: SIM118 (a SieveCache, not a dict)
    assert ("mlx5_0", "mlx5_0") not in keys  # the failed endpoint left the pool
    assert ("mlx5_1", "mlx5_1") in keys  # retry 1: next local device and next peer device
    # Once the link is back and the path's cool-down is over, the pair is handshaken anew and
    # the target replaces (closes) the QPs of the failed endpoint.
    fabric.broken.clear()
    rdma.paths.cooldown = 0.0
    old_peer_qps = [qp for qp in fabric.qps.values() if qp.device.host == "b" and qp.device.name == "mlx5_0"
                    and fabric.qps[qp.target.remote_qpn].device.name == "mlx5_0"]
    handshakes = rdma.num_handshakes
    initiator.write(handle, source, base, 1024)
    assert rdma.num_handshakes == handshakes + 1
    assert ("mlx5_0", "mlx5_0") in {key[2:] for key in rdma._pool.keys()}  # noqa: SIM118 (a SieveCache)
    assert all(qp.closed for qp in old_peer_qps)


def test_a_range_outside_the_peer_region_fails_without_retry(fabric, rdma_engines):
    initiator, target = rdma_engines()
    remote, base = _target_buffer(target, size=MiB)
    data = np.ones(4096, np.uint8)
    initiator.register_local_memory(data)
    handle = initiator.open_segment(target.name)
    desc = initiator.segment_descriptor(handle)
    assert [d.name for d in desc.rdma_devices] == ["mlx5_0", "mlx5_1"]
    assert {device for device, _ in desc.buffers[0].rkeys} == {"mlx5_0", "mlx5_1"}
    target.unregister_local_memory(remote)  # the MRs go with it; our cached descriptor is stale
    batch = initiator.allocate_batch_id(1)
    initiator.submit_transfer(batch, [TransferRequest(OpCode.WRITE, address_of(data), handle, base, 4096)])
    status = initiator.wait_batch(batch, timeout=5)
    assert status.status == Status.FAILED and "IBV_WC_REM_ACCESS_ERR" in status.error


def test_auto_prefers_shm_on_one_host_and_rdma_for_other_buffers(fabric):
    options = EngineOptions(protocol="auto", transfer_timeout=10.0)
    with TransferEngine(options=options, verbs=FakeVerbs(fabric, "a", ["mlx5_0"])) as initiator, \
            TransferEngine(options=options, verbs=FakeVerbs(fabric, "b", ["mlx5_0"])) as target:
        shared = target.allocate_shared_buffer(MiB)
        private, base = _target_buffer(target, MiB)
        data = np.full(4096, 5, np.uint8)
        initiator.register_local_memory(data)
        handle = initiator.open_segment(target.name)
        initiator.write(handle, address_of(data), address_of(shared), 4096)
        assert fabric.posts == []  # shared memory carried it
        initiator.write(handle, address_of(data), base, 4096)
        assert len(fabric.posts) == 1 and np.array_equal(private[:4096], data)
        assert initiator.status()["transports"] == ["shm", "rdma", "tcp"]
        assert initiator.status()["rdma_unavailable"] == ""
