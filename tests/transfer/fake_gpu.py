"""A GPU buffer for a machine without a GPU: the DeviceBuffer interface over ordinary memory.

The memory stands for device memory (its address plays the device pointer, as UVA makes real
device pointers distinct from host ones); the engine sees location ``cuda:N``, gives it a
separate pinned mirror, and must stage every byte between the two. It counts the staging
copies it is asked to do, so a test can tell that bytes went through the mirror.
"""

from __future__ import annotations

import numpy as np

from transfer.gpu.device_memory import view_address


class FakeGpuBuffer:
    def __init__(self, nbytes: int = 0, index: int = 0, memory: np.ndarray | None = None) -> None:
        """Fresh zeroed "device memory" of ``nbytes``, or ``memory`` (a flat uint8 array) itself."""
        self.memory = np.zeros(nbytes, np.uint8) if memory is None else memory
        self.pointer = view_address(memoryview(self.memory))
        self.nbytes, self.location = self.memory.nbytes, f"cuda:{index}"
        self.mirror: np.ndarray | None = None
        self.copies: list[tuple[str, int, int]] = []

    def pinned_host(self) -> memoryview:
        self.mirror = np.zeros(self.nbytes, np.uint8)
        return memoryview(self.mirror)

    def to_host(self, host: memoryview, offset: int, length: int) -> None:
        self.copies.append(("to_host", offset, length))
        np.frombuffer(host, np.uint8)[offset:offset + length] = self.memory[offset:offset + length]

    def from_host(self, host: memoryview, offset: int, length: int) -> None:
        self.copies.append(("from_host", offset, length))
        self.memory[offset:offset + length] = np.frombuffer(host, np.uint8)[offset:offset + length]
