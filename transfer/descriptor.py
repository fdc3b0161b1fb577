"""Segment descriptors: what a peer needs to know to move bytes into or out of a segment.

A descriptor names the segment, says which host it lives on (so shared memory can be chosen),
lists its data-plane endpoints (one per NIC it listens on) and its remote-accessible buffers.
``incarnation`` is random per engine start: a peer restarted under the same name gets a new one,
so connections and cached descriptors of the old process are recognised as stale. ``version``
is assigned by the metadata service on every publish.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

from transfer.errors import InvalidArgument, MalformedMessage


@dataclass(frozen=True)
class BufferDesc:
    address: int
    length: int
    location: str
    shm_name: str | None = None
    rkeys: tuple[tuple[str, int], ...] = ()  # (RDMA device, remote key) per device it is registered on

    @property
    def end(self) -> int:
        return self.address + self.length


@dataclass(frozen=True)
class Endpoint:
    nic: str
    host: str
    port: int


@dataclass(frozen=True)
class RdmaDeviceDesc:
    name: str
    lid: int
    gid: str


@dataclass
class SegmentDescriptor:
    name: str
    incarnation: str
    host_id: str
    rpc_address: str = ""
    endpoints: list[Endpoint] = field(default_factory=list)
    buffers: list[BufferDesc] = field(default_factory=list)
    priority_matrix: dict[str, list[list[str]]] = field(default_factory=dict)
    version: int = 0
    rdma_devices: list[RdmaDeviceDesc] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> SegmentDescriptor:
        try:
            return cls(
                name=str(data["name"]),
                incarnation=str(data["incarnation"]),
                host_id=str(data["host_id"]),
                rpc_address=str(data.get("rpc_address", "")),
                endpoints=[Endpoint(str(e["nic"]), str(e["host"]), int(e["port"]))
                           for e in data.get("endpoints", [])],
                buffers=[BufferDesc(int(b["address"]), int(b["length"]), str(b["location"]),
                                    b.get("shm_name"),
                                    tuple((str(d), int(k)) for d, k in b.get("rkeys", ())))
                         for b in data.get("buffers", [])],
                priority_matrix=dict(data.get("priority_matrix", {})),
                version=int(data.get("version", 0)),
                rdma_devices=[RdmaDeviceDesc(str(d["name"]), int(d["lid"]), str(d["gid"]))
                              for d in data.get("rdma_devices", [])],
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedMessage(f"malformed segment descriptor ({type(exc).__name__}: {exc})") from None

    def find_buffer(self, address: int, length: int) -> BufferDesc:
        """The peer buffer wholly containing the range; checked before anything is sent."""
        for buffer in self.buffers:
            if buffer.address <= address and address + length <= buffer.end:
                return buffer
        raise InvalidArgument(
            f"[{address:#x}, +{length}) is not inside a buffer of segment {self.name!r}")


def local_host_id() -> str:
    """Same value in every process of one booted machine, different across machines."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = str(os.getppid())
    return f"{socket.gethostname()}/{boot}"
