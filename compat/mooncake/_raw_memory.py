"""Raw addresses as buffers, and the copies between them, for host memory only.

Mooncake's Python API names memory by integer address (``tensor.data_ptr()``, an allocator's
pointer) and length, while our engine registers buffer objects. A numpy array over a ctypes
array at the address is such an object: registering it makes exactly [address, +length)
usable, and holding it keeps nothing else alive, so the caller stays the owner of the memory,
as with the original.

That view reads the address as host memory, so a GPU pointer (vLLM and SGLang register their
KV caches by ``data_ptr()``) must never reach it: it would be read as garbage or crash on the
first copy. Every address is first asked of the CUDA driver (``cuPointerGetAttribute``, memory
type), and one that is device memory is refused with ``DeviceMemoryRefused`` (the caller's
INVALID_PARAMS / INVALID_ARGUMENT code) and one log line. Host, pinned and managed memory pass.
Without a CUDA driver, or before any CUDA context exists in this process, no device memory
exists here, so every address is host memory by construction and the query answers so.
``pointer_query`` is the seam tests replace to stand for the GPU this machine lacks.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import numpy as np

log = logging.getLogger("mooncake")

HOST, DEVICE = "host", "device"
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_MEMORYTYPE_DEVICE, _CU_MEMORYTYPE_ARRAY = 2, 3


class DeviceMemoryRefused(ValueError):
    """A device pointer given where this package needs host memory."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _driver_query() -> Callable[[int], str]:
    """The memory kind of an address per the CUDA driver; host for all without a driver."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        get_attribute = driver.cuPointerGetAttribute
    except (OSError, AttributeError):
        return lambda address: HOST
    get_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    get_attribute.restype = ctypes.c_int

    def query(address: int) -> str:
        memory_type = ctypes.c_uint(0)
        status = get_attribute(ctypes.byref(memory_type), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address)
        # Not 0 (CUDA_SUCCESS): not initialised, or an address CUDA does not know: host memory.
        # Managed memory reports its unified type; pinned host memory reports host.
        if status == 0 and memory_type.value in (_CU_MEMORYTYPE_DEVICE, _CU_MEMORYTYPE_ARRAY):
            return DEVICE
        return HOST
    return query


pointer_query: Callable[[int], str] = _driver_query()


def check_host(address: int, length: int, operation: str, code: int) -> None:
    """DeviceMemoryRefused (logged once) when [address, +length) starts in device memory."""
    if pointer_query(address) != HOST:
        log.warning("%s refused (%d): %#x is GPU memory; this Mooncake API takes host memory only",
                    operation, code, address)
        raise DeviceMemoryRefused(f"{operation}: {address:#x} (+{length}) is device memory, not host memory",
                                  code)


def array_at(address: int, length: int) -> np.ndarray:
    """A writable uint8 array over [address, +length) that does not own the memory. The
    callers that take addresses from users check them with ``check_host`` first."""
    if address <= 0 or length <= 0:
        raise ValueError(f"[{address:#x}, +{length}) is not a memory range")
    return np.ctypeslib.as_array((ctypes.c_ubyte * length).from_address(address))


def copy(destination: int, source: int, length: int) -> None:
    ctypes.memmove(destination, source, length)


def address_of_bytes(buffer: bytearray | np.ndarray) -> int:
    """The address of a writable buffer's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
