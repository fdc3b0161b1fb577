"""The seam between the RDMA transport and a verbs library: the few calls the transport makes.

The transport never imports pyverbs. It talks to a :class:`Verbs` provider: the real one is
:mod:`transfer.rdma.verbs_pyverbs` (the only module that touches pyverbs); tests pass a stand-in that
performs WRITE/READ as memory copies between registered regions. Both implement exactly this
surface, so the code above it (probing, handshake, slicing, completions, retries) is the same.

Work requests carry a caller-chosen integer ``wr_id``; every posted request produces exactly one
:class:`Completion` on its device's completion queue, successful or not (a QP in error flushes
what it still holds with an error status, as real HCAs do).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MTUS = (256, 512, 1024, 2048, 4096)  # the IB path MTUs, in bytes


class VerbsUnavailable(Exception):
    """No usable verbs library or device; the message says which and why (shown to users)."""


class Op(enum.IntEnum):
    WRITE = 0
    READ = 1


@dataclass(frozen=True)
class PortInfo:
    number: int
    active: bool
    state: str  # e.g. "ACTIVE", "DOWN": named in the "no active port" message
    lid: int
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    active_mtu: int  # bytes


@dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str
    roce_v2: bool


@dataclass(frozen=True)
class MemoryKeys:
    lkey: int
    rkey: int


@dataclass(frozen=True)
class Completion:
    wr_id: int
    ok: bool
    status: str  # the verbs status text, e.g. "IBV_WC_RETRY_EXC_ERR", for the failure message


@dataclass(frozen=True)
class QpTarget:
    """What connecting a local QP to a remote one needs (learnt in the handshake)."""

    port: int
    gid_index: int
    remote_gid: str
    remote_lid: int
    remote_qpn: int
    local_psn: int
    remote_psn: int
    mtu: int


class QueuePair(Protocol):
    qpn: int

    def connect(self, target: QpTarget) -> None:
        """RESET -> INIT -> RTR -> RTS towards the remote QP."""

    def post(self, wr_id: int, op: Op, local_address: int, length: int, lkey: int,
             remote_address: int, rkey: int) -> None:
        """Post one signalled RDMA WRITE or READ; raises on a refused post."""

    def close(self) -> None: ...


class Device(Protocol):
    name: str

    def ports(self) -> list[PortInfo]: ...
    def gids(self, port: int) -> list[GidEntry]: ...
    def register(self, address: int, length: int) -> tuple[MemoryKeys, object]:
        """Register [address, +length) for local write and remote read/write; returns the keys
        and a handle for :meth:`deregister`."""
    def deregister(self, handle: object) -> None: ...
    def create_qp(self, max_wr: int) -> QueuePair: ...
    def poll(self, max_entries: int) -> list[Completion]: ...
    def close(self) -> None: ...


class Verbs(Protocol):
    def device_names(self) -> list[str]:
        """Names of the RDMA devices present; raises VerbsUnavailable when there are none."""

    def open(self, name: str) -> Device: ...
