"""The metadata service: a versioned in-memory table of segment descriptors, and its RPC ops.

The table is pure (no I/O, callers hold no locks: it takes its own). ``serve_metadata`` exposes
it on any :class:`RpcServer`, which is how the master daemon serves it; the ops are

    te.meta.put     {"descriptor": map}                 -> {"version": int}
    te.meta.get     {"name": str}                       -> descriptor map | SEGMENT_NOT_FOUND
    te.meta.remove  {"name": str, "incarnation": str}   -> {"removed": bool}
    te.meta.list    {}                                  -> {"names": [str]}

A put from a new incarnation replaces the old descriptor (the peer restarted) and bumps the
version, so clients that compare versions drop what they cached. A remove names the incarnation
so a late remove from a dead process cannot delete its successor's descriptor.
"""

from __future__ import annotations

import threading
from typing import Any

from transfer.descriptor import SegmentDescriptor
from transfer.errors import SegmentNotFound, TableFull
from transfer.rpc.client_server import Request, RpcServer


class MetadataTable:
    def __init__(self, max_entries: int = 16384) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._descriptors: dict[str, dict[str, Any]] = {}
        self._next_version = 1

    def put(self, descriptor: SegmentDescriptor) -> int:
        with self._lock:
            if descriptor.name not in self._descriptors and len(self._descriptors) >= self.max_entries:
                raise TableFull(f"{len(self._descriptors)} segments are published, the most this master "
                                "holds (metadata_max_entries)")
            version = self._next_version
            self._next_version += 1
            wire = descriptor.to_wire()
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
            del self._descriptors[name]
            return True

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
