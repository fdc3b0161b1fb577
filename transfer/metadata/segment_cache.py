"""Open segments: handle numbers, and the cache of peer descriptors behind them.

Descriptors are fetched from the metadata backend on first use and cached. An entry is dropped
when a transport finds it stale (the peer restarted: its hello refuses us, its region is gone)
or when a newer incarnation shows up (a P2P exchange); the next use fetches it again.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from transfer.descriptor import SegmentDescriptor
from transfer.errors import SegmentNotFound
from transfer.metadata.client import MetadataBackend


class SegmentCache:
    def __init__(self, backend: MetadataBackend, on_stale: Callable[[str], None]) -> None:
        self._backend, self._on_stale = backend, on_stale
        self._lock = threading.Lock()
        self._handles: dict[int, str] = {}
        self._by_name: dict[str, int] = {}
        self._descriptors: dict[str, SegmentDescriptor] = {}
        self._next = itertools.count(1)

    def open(self, name: str) -> int:
        self.descriptor_of(name)  # an unknown segment fails here, not on first transfer
        with self._lock:
            if name not in self._by_name:
                handle = next(self._next)
                self._handles[handle], self._by_name[name] = name, handle
            return self._by_name[name]

    def close(self, handle: int) -> None:
        with self._lock:
            name = self._handles.pop(handle, None)
            if name is None:
                raise SegmentNotFound(f"segment handle {handle} is not open")
            del self._by_name[name]
            self._descriptors.pop(name, None)

    def name_of(self, handle: int) -> str:
        with self._lock:
            name = self._handles.get(handle)
        if name is None:
            raise SegmentNotFound(f"segment handle {handle} is not open")
        return name

    def get(self, handle: int) -> SegmentDescriptor:
        return self.descriptor_of(self.name_of(handle))

    def descriptor_of(self, name: str) -> SegmentDescriptor:
        with self._lock:
            cached = self._descriptors.get(name)
        if cached is not None:
            return cached
        fresh = self._backend.fetch(name)
        self.learn(fresh)
        return fresh

    def learn(self, descriptor: SegmentDescriptor) -> None:
        """Cache a descriptor; a different incarnation than cached makes the old one stale."""
        with self._lock:
            old = self._descriptors.get(descriptor.name)
            self._descriptors[descriptor.name] = descriptor
        if old is not None and old.incarnation != descriptor.incarnation:
            self._on_stale(descriptor.name)

    def invalidate(self, name: str, incarnation: str | None = None) -> None:
        with self._lock:
            cached = self._descriptors.get(name)
            if cached is None or (incarnation is not None and cached.incarnation != incarnation):
                return
            del self._descriptors[name]
        self._on_stale(name)

    def sync(self, name: str | None = None) -> None:
        """Refetch one cached descriptor, or all of them (Mooncake's syncSegmentCache)."""
        with self._lock:
            names = [name] if name else list(self._descriptors)
        for each in names:
            self.learn(self._backend.fetch(each))
