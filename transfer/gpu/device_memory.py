"""GPU buffers as the engine sees them: a small interface, and the staging copies built on it.

A transport moves bytes between host views. A GPU buffer (torch CUDA tensor, cupy array) gets a
pinned host *mirror* of the same size at registration; its address in requests and descriptors
stays the device pointer, and its location is ``cuda:N``. Where the bytes go through the mirror
(shm, TCP, and RDMA without GPUDirect) the engine stages: device -> mirror before a WRITE leaves,
mirror -> device after a READ landed. With GPUDirect RDMA the device pointer itself is registered
and the RDMA transport reads and writes GPU memory without the mirror.

:class:`DeviceBuffer` is what the engine calls; :mod:`transfer.gpu.cuda_memory` implements it for
torch and cupy, and tests implement it with ordinary memory (this machine has no GPU).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable


@runtime_checkable
class DeviceBuffer(Protocol):
    location: str  # "cuda:N"
    pointer: int  # device address of byte 0
    nbytes: int

    def pinned_host(self) -> memoryview:
        """A new page-locked host buffer of ``nbytes`` (flat, writable bytes): the mirror."""

    def to_host(self, host: memoryview, offset: int, length: int) -> None:
        """Copy device bytes [offset, +length) into the same range of ``host``; returns when done."""

    def from_host(self, host: memoryview, offset: int, length: int) -> None:
        """Copy ``host`` [offset, +length) into the same device range; returns when done."""


Adapter = Callable[[Any], "DeviceBuffer | None"]
HOST_TYPES = frozenset({bytes, bytearray, memoryview, mmap.mmap})


def device_buffer_of(obj: Any) -> DeviceBuffer | None:
    """``obj`` as a DeviceBuffer when it is GPU memory, else None (host memory)."""
    if type(obj) in HOST_TYPES:
        # The common case, first: isinstance against a runtime-checkable Protocol inspects its
        # attributes (about 9 us), a visible share of a 4 KiB put.
        return None
    if isinstance(obj, DeviceBuffer):
        return obj
    from transfer.gpu.cuda_memory import cuda_buffer  # imports torch/cupy only for their objects

    return cuda_buffer(obj)


def view_address(view: memoryview) -> int:
    """Address of a writable byte view's first byte (how a slice is placed in its buffer)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))

