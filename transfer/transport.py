"""The interface every data-plane transport implements (shm and tcp here; rdma in its own issue).

A transport moves :class:`Slice` s and reports each outcome to the engine's :class:`SliceSink`
exactly once per attempt: ``done`` when the bytes are in place (for a WRITE: in the target's
memory), ``failed`` with the path that failed, so the engine can retry elsewhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from transfer.batch import Slice
from transfer.descriptor import BufferDesc, Endpoint, SegmentDescriptor


class SliceSink(Protocol):
    def done(self, piece: Slice) -> None: ...
    def failed(self, piece: Slice, reason: str, path: str | None, fatal: bool = False) -> None: ...


class Transport(ABC):
    name: str

    @abstractmethod
    def reaches(self, peer: SegmentDescriptor, buffer: BufferDesc) -> bool:
        """Whether this transport can move bytes to/from that peer buffer."""

    @abstractmethod
    def submit(self, pieces: list[Slice]) -> None:
        """Start moving the slices; must not block on the network."""

    def endpoints(self) -> list[Endpoint]:
        """Listeners to publish in our descriptor (none for transports with no listener)."""
        return []

    def forget_peer(self, peer_name: str) -> None:  # noqa: B027 (a transport that caches nothing has nothing to drop)
        """Drop cached connections or mappings of a peer that restarted or went away."""

    @abstractmethod
    def close(self) -> None:
        """Release every socket, mapping and thread this transport owns."""
