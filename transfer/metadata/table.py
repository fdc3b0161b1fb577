"""The metadata service: a versioned in-memory table of segment descriptors, and its RPC ops.

The table is pure (no I/O, callers hold no locks: it takes its own). ``serve_metadata`` exposes
it on any :class:`RpcServer`, which is how the master daemon serves it; the ops are

    te.meta.put     {"descriptor": map}                 -> {"version": int}
    te.meta.get     {"name": str}                       -> descriptor map | SEGMENT_NOT_FOUND
    te.meta.remove  {"name": str, "incarnation": str}   -> {"removed": bool}
    te.meta.list    {}                                  -> {"names": [str]}

A put from a new incarnation replaces the old descriptor (the peer restarted) and bumps the
version, so clients that compare versions drop what they cached. A put of the very descriptor
already held only marks it fresh: engines publish theirs again every so often, and
:meth:`MetadataTable.expire` drops those not refreshed within the TTL (an engine that died
without withdrawing), so dead descriptors do not fill the table. A remove names the incarnation
so a late remove from a dead process cannot delete its successor's descriptor.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from transfer.descriptor import SegmentDescriptor
from transfer.errors import SegmentNotFound, TableFull
from transfer.rpc.client_server import Request, RpcServer


class MetadataTable:
    def __init__(self, max_entries: int = 16384, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries, self.clock = max_entries, clock
        self._lock = threading.Lock()
        self._descriptors: dict[str, dict[str, Any]] = {}
        self._published: dict[str, float] = {}  # name -> when it was last put
        self._next_version = 1

    def put(self, descriptor: SegmentDescriptor) -> int:
        wire = descriptor.to_wire()
        with self._lock:
            held = self._descriptors.get(descriptor.name)
            self._published[descriptor.name] = self.clock()
            if held is not None and {**held, "version": None} == {**wire, "version": None}:
                return held["version"]  # a refresh: peers' caches stay valid
            if held is None and len(self._descriptors) >= self.max_entries:
                del self._published[descriptor.name]
                raise TableFull(f"{len(self._descriptors)} segments are published, the most this master "
                                "holds (metadata_max_entries)")
            version = self._next_version
            self._next_version += 1
            wire["version"] = version
            self._descriptors[descriptor.name] = wire
            return version

    def get(self, name: str) -> SegmentDescriptor:
        with self._lock:
            wire = self._descriptors.get(name)
        if wire is None:
            raise SegmentNotFound(f"segment {name!r} is not published")
        return SegmentDescriptor.from_wire(wire)

    def remove(self, name: str, incarnation: str) -> bool:
        with self._lock:
            wire = self._descriptors.get(name)
            if wire is None or wire["incarnation"] != incarnation:
                return False
            del self._descriptors[name], self._published[name]
            return True

    def expire(self, ttl: float) -> list[str]:
        """Drop the descriptors not published within ``ttl`` seconds; their names."""
        now = self.clock()
        with self._lock:
            stale = [name for name, when in self._published.items() if now - when > ttl]
            for name in stale:
                del self._descriptors[name], self._published[name]
            return stale

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._descriptors)


def serve_metadata(server: RpcServer, table: MetadataTable) -> None:
    """Register the te.meta.* ops on ``server`` (before or after it starts)."""

    def put(request: Request) -> dict:
        return {"version": table.put(SegmentDescriptor.from_wire(request.args.get("descriptor")))}

    def get(request: Request) -> dict:
        return table.get(str(request.args.get("name", ""))).to_wire()

    def remove(request: Request) -> dict:
        args = request.args
        return {"removed": table.remove(str(args.get("name", "")), str(args.get("incarnation", "")))}

    server.register("te.meta.put", put)
    server.register("te.meta.get", get)
    server.register("te.meta.remove", remove)
    server.register("te.meta.list", lambda request: {"names": table.names()})
