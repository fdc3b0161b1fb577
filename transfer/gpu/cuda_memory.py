"""The CUDA side of :class:`transfer.gpu.device_memory.DeviceBuffer`: torch CUDA tensors and cupy arrays.

torch and cupy are imported only when an object of theirs is registered (each costs seconds to
import), and cupy only through the ``gpu`` extra. Copies are synchronous: a staged slice must be
in place before the transport sends it or the engine reports it done.
"""

from __future__ import annotations

import os
from typing import Any

from transfer.errors import InvalidArgument
from transfer.gpu.device_memory import view_address

# Kernel modules that let an RDMA NIC read and write GPU memory (GPUDirect RDMA).
PEERMEM_MODULES = ("/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem")


def gpudirect_available() -> bool:
    return any(os.path.isdir(path) for path in PEERMEM_MODULES)


def cuda_buffer(obj: Any) -> TorchCudaBuffer | CupyBuffer | None:
    module = type(obj).__module__
    if module.startswith("torch") and getattr(getattr(obj, "device", None), "type", None) == "cuda":
        return TorchCudaBuffer(obj)
    if module.startswith("cupy") and hasattr(obj, "data") and hasattr(obj, "device"):
        return CupyBuffer(obj)
    return None


class TorchCudaBuffer:
    def __init__(self, tensor: Any) -> None:
        import torch

        if not tensor.is_contiguous():
            raise InvalidArgument("tensor must be contiguous")
        self._torch = torch
        self.tensor = tensor.detach().reshape(-1).view(torch.uint8)
        self.pointer = self.tensor.data_ptr()
        self.nbytes = self.tensor.numel()
        self.location = f"cuda:{self.tensor.device.index}"

    def pinned_host(self) -> memoryview:
        host = self._torch.empty(self.nbytes, dtype=self._torch.uint8, pin_memory=True)
        return memoryview(host.numpy())  # the array keeps the pinned tensor alive

    def _host_tensor(self, host: memoryview, offset: int, length: int) -> Any:
        import numpy as np  # with torch or cupy only: the engine imports this module for gpudirect_available

        return self._torch.from_numpy(np.frombuffer(host, np.uint8, length, offset))

    def to_host(self, host: memoryview, offset: int, length: int) -> None:
        self._host_tensor(host, offset, length).copy_(self.tensor[offset:offset + length])

    def from_host(self, host: memoryview, offset: int, length: int) -> None:
        self.tensor[offset:offset + length].copy_(self._host_tensor(host, offset, length))


class CupyBuffer:
    def __init__(self, array: Any) -> None:
        import cupy

        if not array.flags.c_contiguous:
            raise InvalidArgument("cupy array must be C-contiguous")
        self._cupy = cupy
        self.array = array
        self.pointer = int(array.data.ptr)
        self.nbytes = int(array.nbytes)
        self.device_id = int(array.device.id)
        self.location = f"cuda:{self.device_id}"

    def pinned_host(self) -> memoryview:
        import numpy as np  # as in TorchCudaBuffer._host_tensor

        pinned = self._cupy.cuda.alloc_pinned_memory(self.nbytes)
        host = np.frombuffer(pinned, np.uint8, self.nbytes)  # keeps the pinned allocation alive
        return memoryview(host)

    def _copy(self, destination: int, source: int, length: int, kind: int) -> None:
        with self._cupy.cuda.Device(self.device_id):
            self._cupy.cuda.runtime.memcpy(destination, source, length, kind)

    def to_host(self, host: memoryview, offset: int, length: int) -> None:
        self._copy(view_address(host) + offset, self.pointer + offset, length,
                   self._cupy.cuda.runtime.memcpyDeviceToHost)

    def from_host(self, host: memoryview, offset: int, length: int) -> None:
        self._copy(self.pointer + offset, view_address(host) + offset, length,
                   self._cupy.cuda.runtime.memcpyHostToDevice)
