"""Raw addresses as buffers, and the copies between them.

Mooncake's Python API names memory by integer address (``tensor.data_ptr()``, an allocator's
pointer) and length, while our engine registers buffer objects. A numpy array over a ctypes
array at the address is such an object: registering it makes exactly [address, +length)
usable, and holding it keeps nothing else alive, so the caller stays the owner of the memory,
as with the original. The address must be host memory: a CUDA device pointer is not readable
through it.
"""

from __future__ import annotations

import ctypes

import numpy as np


def array_at(address: int, length: int) -> np.ndarray:
    """A writable uint8 array over [address, +length) that does not own the memory."""
    if address <= 0 or length <= 0:
        raise ValueError(f"[{address:#x}, +{length}) is not a memory range")
    return np.ctypeslib.as_array((ctypes.c_ubyte * length).from_address(address))


def copy(destination: int, source: int, length: int) -> None:
    ctypes.memmove(destination, source, length)


def address_of_bytes(buffer: bytearray | np.ndarray) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
