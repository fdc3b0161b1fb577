"""GPU buffers: cuda:N registration and staging through the pinned host mirror.

No GPU here, so :class:`tests.transfer.fake_gpu.FakeGpuBuffer` implements the DeviceBuffer
interface over ordinary memory standing for device memory, and counts the staging copies.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.transfer.fake_gpu import FakeGpuBuffer
from tests.transfer.rdma.fake_verbs import Fabric, FakeVerbs

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.gpu.device_memory import view_address
from transfer.memory import address_of

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("protocol", ["shm", "tcp"])
def test_writes_stage_out_and_reads_stage_in(make_engine, protocol):
    target, initiator = make_engine(protocol=protocol), make_engine(protocol=protocol, slice_size=256 * KiB,
                                                                    slice_threshold=256 * KiB)
    remote = target.allocate_shared_buffer(2 * MiB)
    gpu = FakeGpuBuffer(MiB)
    assert initiator.register_local_memory(gpu) == gpu.pointer
    assert initiator.memory.find(gpu.pointer, 1).location == "cuda:0"
    assert address_of(gpu, 10) == gpu.pointer + 10
    handle = initiator.open_segment(target.name)
    base = address_of(remote)
    gpu.memory[:] = np.arange(MiB) % 251
    initiator.write(handle, gpu.pointer + 4096, base, 64 * KiB)
    assert np.array_equal(remote[:64 * KiB], gpu.memory[4096:4096 + 64 * KiB])
    assert gpu.copies == [("to_host", 4096, 64 * KiB)]
    gpu.copies.clear()
    remote[:] = 7
    initiator.read(handle, gpu.pointer, base, MiB)  # lands in the mirror slice by slice
    assert (gpu.memory == 7).all()
    assert sorted(gpu.copies) == [("from_host", offset, 256 * KiB) for offset in range(0, MiB, 256 * KiB)]
    # Without GPUDirect peers cannot address the GPU buffer: it is published local-only.
    assert all(b.address != gpu.pointer for b in initiator.descriptor().buffers)
    initiator.unregister_local_memory(gpu)


def _rdma_pair(fabric, gpudirect):
    options = EngineOptions(protocol="rdma", transfer_timeout=10.0)
    return [TransferEngine(options=options, verbs=FakeVerbs(fabric, host, ["mlx5_0"]), gpudirect=gpudirect)
            for host in ("a", "b")]


def test_rdma_without_gpudirect_registers_the_pinned_mirror():
    fabric = Fabric()
    initiator, target = _rdma_pair(fabric, gpudirect=False)
    try:
        remote = np.zeros(MiB, np.uint8)
        target.register_local_memory(remote)
        gpu = FakeGpuBuffer(MiB)
        gpu.memory[:] = 3
        initiator.register_local_memory(gpu)
        assert view_address(memoryview(gpu.mirror)) in {a for a, _ in fabric.regions.values()}
        assert gpu.pointer not in {a for a, _ in fabric.regions.values()}
        initiator.write(initiator.open_segment(target.name), gpu.pointer, address_of(remote), MiB)
        assert (remote == 3).all() and gpu.copies == [("to_host", 0, MiB)]
    finally:
        initiator.close(), target.close()


def test_rdma_with_gpudirect_addresses_gpu_memory_directly():
    fabric = Fabric()
    initiator, target = _rdma_pair(fabric, gpudirect=True)
    try:
        gpu_target = FakeGpuBuffer(MiB)
        target.register_local_memory(gpu_target)  # published: the NIC reaches it
        [published] = target.descriptor().buffers
        assert (published.address, published.location) == (gpu_target.pointer, "cuda:0")
        data = np.full(MiB, 9, np.uint8)
        initiator.register_local_memory(data)
        handle = initiator.open_segment(target.name)
        initiator.write(handle, address_of(data), gpu_target.pointer, MiB)
        assert (gpu_target.memory == 9).all()
        assert (gpu_target.mirror == 0).all() and gpu_target.copies == []  # no staging
        gpu_local = FakeGpuBuffer(MiB)
        initiator.register_local_memory(gpu_local)
        initiator.read(handle, gpu_local.pointer, gpu_target.pointer, MiB)
        assert (gpu_local.memory == 9).all() and gpu_local.copies == []
    finally:
        initiator.close(), target.close()


@pytest.mark.gpu
def test_cuda_tensor_and_cupy_array_round_trip_through_staging(make_engine):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    target, initiator = make_engine(protocol="tcp"), make_engine(protocol="tcp")
    remote = target.allocate_shared_buffer(MiB)
    handle = initiator.open_segment(target.name)
    tensor = torch.arange(MiB, dtype=torch.uint8, device="cuda:0")
    initiator.register_local_memory(tensor)
    assert initiator.memory.find(tensor.data_ptr(), 1).location == "cuda:0"
    initiator.write(handle, tensor.data_ptr(), address_of(remote), MiB)
    assert np.array_equal(remote, tensor.cpu().numpy())
    remote[:] = 5
    initiator.read(handle, tensor.data_ptr(), address_of(remote), MiB)
    assert bool((tensor == 5).all())
    try:
        import cupy
    except ImportError:
        return  # the gpu extra is not installed; the torch path above ran
    array = cupy.zeros(MiB, dtype=cupy.uint8)
    initiator.register_local_memory(array)
    initiator.read(handle, int(array.data.ptr), address_of(remote), MiB)
    assert int((array == 5).sum()) == MiB


def test_buffer_at_reads_the_device_bytes_and_copy_to_device_writes_the_view_back(make_engine):
    """What the store client's checksums read, and what a disk replica is written through."""
    engine = make_engine(protocol="tcp")
    gpu = FakeGpuBuffer(MiB)
    engine.register_local_memory(gpu)
    gpu.memory[:] = np.arange(MiB) % 251
    view = engine.buffer_at(gpu.pointer + 4096, 100)
    assert bytes(view) == gpu.memory[4096:4196].tobytes() and gpu.copies == [("to_host", 4096, 100)]
    view[:] = b"\x07" * 100
    assert (gpu.memory[4096:4196] != 7).any()  # the view is the mirror, not the device
    engine.copy_to_device(gpu.pointer + 4096, 100)
    assert (gpu.memory[4096:4196] == 7).all() and gpu.copies[-1] == ("from_host", 4096, 100)
    host = np.zeros(64, np.uint8)
    engine.register_local_memory(host)
    engine.buffer_at(address_of(host), 64)[:] = b"\x01" * 64
    engine.copy_to_device(address_of(host), 64)  # host memory: the view is the memory itself
    assert (host == 1).all() and len(gpu.copies) == 2
