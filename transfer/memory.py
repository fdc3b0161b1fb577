"""Registered local memory: which address ranges a transfer may read from or write into.

As in Mooncake, memory is named by virtual address: a request's local side is an address inside
a registered buffer and its remote side is an address inside one of the peer's buffers. Every
accepted object is turned into a flat byte memoryview once, at registration, so the transports
slice it without copying and the registration pins the object (a bytearray cannot be resized
while a view of it exists).
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transfer.descriptor import BufferDesc
from transfer.errors import AddressNotRegistered, AddressOverlapped, InvalidArgument
from transfer.gpu.device_memory import device_buffer_of

if TYPE_CHECKING:
    import numpy as np

# Below this a copy is a memoryview slice assignment: numpy's wrapping costs more than the
# copy, and a copy this short gains nothing from releasing the GIL. It also keeps numpy out of
# a process that moves only small objects (a `mooncake get` of a few KiB imports none of it).
SMALL_COPY = 64 * 1024


@dataclass
class RegisteredBuffer:
    address: int
    length: int
    location: str
    view: memoryview  # flat, writable, format "B"
    shm_name: str | None = None  # set when the memory lives in a named shared-memory region
    remote_accessible: bool = True
    device: Any = None  # a DeviceBuffer whose pinned host mirror ``view`` is
    rkeys: tuple[tuple[str, int], ...] = ()  # set once the RDMA transport registered it

    @property
    def end(self) -> int:
        return self.address + self.length

    def describe(self) -> BufferDesc:
        return BufferDesc(self.address, self.length, self.location, self.shm_name, self.rkeys)


def as_byte_view(obj: Any) -> tuple[memoryview, int]:
    """A flat writable byte view of ``obj`` and its start address.

    Accepts numpy arrays, bytearray, mmap, memoryview and CPU torch tensors (all contiguous).
    """
    if type(obj).__module__.startswith("torch"):
        if obj.device.type != "cpu":
            raise InvalidArgument(
                f"{obj.device} memory needs the gpu extra's staging transport, not available here")
        if not obj.is_contiguous():
            raise InvalidArgument("tensor must be contiguous")
        obj = obj.detach().view(-1).view(dtype=_torch_uint8()).numpy()
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(f"{type(obj).__name__} does not expose a buffer") from None
    if view.readonly:
        raise InvalidArgument("registered memory must be writable")
    if not view.c_contiguous:
        raise InvalidArgument("registered memory must be contiguous")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.nbytes == 0:
        raise InvalidArgument("registered memory must not be empty")
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    return view, address


def _torch_uint8() -> Any:
    import torch

    return torch.uint8


def address_of(obj: Any, offset: int = 0) -> int:
    """The address of byte ``offset`` of a buffer-like object (for building requests); for GPU
    memory, the device address."""
    device = device_buffer_of(obj)
    nbytes, address = (device.nbytes, device.pointer) if device else _host_extent(obj)
    if not 0 <= offset <= nbytes:
        raise InvalidArgument(f"offset {offset} outside a buffer of {nbytes} bytes")
    return address + offset


def _host_extent(obj: Any) -> tuple[int, int]:
    view, address = as_byte_view(obj)
    return view.nbytes, address


def as_array(view: memoryview) -> np.ndarray:
    """A numpy array over a byte view, for copies that release the GIL."""
    import numpy as np  # only for large copies: see SMALL_COPY

    return np.frombuffer(view, dtype=np.uint8)


def copy_into(target: memoryview, source: memoryview) -> None:
    """``target[:] = source`` for two byte views of one length; from SMALL_COPY up through numpy,
    which releases the GIL while it copies."""
    if source.nbytes <= SMALL_COPY:
        target[:] = source
    else:
        import numpy as np  # see SMALL_COPY

        np.copyto(as_array(target), as_array(source))


class MemoryRegistry:
    """Non-overlapping registered buffers, sorted by address. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._buffers: list[RegisteredBuffer] = []

    def add(self, buffer: RegisteredBuffer) -> None:
        with self._lock:
            i = bisect.bisect_right(self._starts, buffer.address)
            before = self._buffers[i - 1] if i else None
            after = self._buffers[i] if i < len(self._buffers) else None
            if (before and before.end > buffer.address) or (after and after.address < buffer.end):
                raise AddressOverlapped(
                    f"[{buffer.address:#x}, {buffer.end:#x}) overlaps a registered buffer")
            self._starts.insert(i, buffer.address)
            self._buffers.insert(i, buffer)

    def remove(self, address: int) -> RegisteredBuffer:
        with self._lock:
            i = bisect.bisect_left(self._starts, address)
            if i == len(self._starts) or self._starts[i] != address:
                raise AddressNotRegistered(f"no buffer registered at {address:#x}")
            del self._starts[i]
            return self._buffers.pop(i)

    def find(self, address: int, length: int) -> RegisteredBuffer:
        """The buffer wholly containing [address, address+length), or AddressNotRegistered."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            buffer = self._buffers[i] if i >= 0 else None
        if buffer is None or address + length > buffer.end:
            raise AddressNotRegistered(
                f"[{address:#x}, +{length}) is not inside memory registered by this engine")
        return buffer

    def all(self) -> list[RegisteredBuffer]:
        with self._lock:
            return list(self._buffers)
