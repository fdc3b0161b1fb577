"""What reads hand back and what standalone clients allocate: ``BufferHandle``,
``ReplicaDescriptor``, ``MooncakeHostMemAllocator`` and a dummy client's ``MemoryPool``."""

from __future__ import annotations

import mmap
import threading

from mooncake._raw_memory import address_of_bytes
from mooncake._setup_args import hostname_of
from store.objects import ReplicaDescriptor as OurReplica


class BufferHandle(bytearray):
    """An object's bytes with the original's handle methods; being a bytearray, it supports the
    buffer protocol (``memoryview(handle)``, ``bytes(handle)``), as LMCache expects."""

    def ptr(self) -> int:
        return address_of_bytes(self) if len(self) else 0

    def size(self) -> int:
        return len(self)


class BufferDescriptor:
    def __init__(self, replica: OurReplica) -> None:
        self.size = replica.size
        self.buffer_address = replica.address
        # The original names the segment: its owner's "host:port", which get_hostname gives and
        # copy/move tasks take as targets. Our engine is named by its store's client id, that name
        # with "#n" added when two live stores of one process share it.
        self.transport_endpoint = hostname_of(replica.segment_name)


class MemoryDescriptor:
    def __init__(self, replica: OurReplica) -> None:
        self.buffer_descriptor = BufferDescriptor(replica)


class ReplicaDescriptor:
    """One complete replica. Ours all live in memory segments (the SSD tier is not reported as
    a replica), so ``is_disk_replica`` is always False."""

    status = "COMPLETE"

    def __init__(self, replica: OurReplica) -> None:
        self._memory = MemoryDescriptor(replica)
        self.segment_name = replica.segment_name

    def is_memory_replica(self) -> bool:
        return True

    def is_disk_replica(self) -> bool:
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        return self._memory

    def __repr__(self) -> str:
        d = self._memory.buffer_descriptor
        return f"ReplicaDescriptor(memory, {self.segment_name}, {d.buffer_address:#x}, {d.size} bytes)"


class MooncakeHostMemAllocator:
    """Page-aligned host memory by address, for standalone clients that register it with
    ``register_buffer``. Anonymous mappings: pages cost RAM only once touched."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int:
        """The address of ``size`` fresh bytes, or 0 when it cannot be had."""
        try:
            mapping = mmap.mmap(-1, size)
        except (OSError, ValueError, OverflowError):
            return 0
        address = address_of_bytes(mapping)
        with self._lock:
            self._maps[address] = mapping
        return address

    def free(self, ptr: int) -> int:
        with self._lock:
            mapping = self._maps.pop(ptr, None)
        if mapping is None:
            return -1
        mapping.close()
        return 0


class MemoryPool:
    """A dummy client's memory pool (``setup_dummy``'s ``mem_pool_size``), handed out by
    ``alloc_from_mem_pool`` from one anonymous mapping, front to back, as the original's shared
    memory helper does: nothing is freed before the pool goes, with its store. Pages cost RAM
    only once touched, so a pool of gigabytes is cheap until used."""

    ALIGNMENT = 64  # a cache line, so neighbouring allocations never share one

    def __init__(self, size: int) -> None:
        self._mapping = mmap.mmap(-1, size) if size else None
        self._base = address_of_bytes(self._mapping) if self._mapping is not None else 0
        self._size = size
        self._next = 0
        self._lock = threading.Lock()

    def allocate(self, size: int) -> int:
        """The address of ``size`` bytes of the pool; 0 when it has not that many left."""
        if size <= 0:
            return 0
        with self._lock:
            start = -(-self._next // self.ALIGNMENT) * self.ALIGNMENT
            if start + size > self._size:
                return 0
            self._next = start + size
            return self._base + start
