"""The master's state and the dataclasses its callers exchange with it.

Requests in (``Segment``, ``ReplicateConfig``, ``ReportedObject``), answers out
(``ReplicaDescriptor``, ``ReplicaList``), and the mutable records the master keeps
(``SegmentState``, ``ObjectMeta``, ``ClientState``). Times are seconds on the caller's clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from store.allocator import RangeAllocator


class ReplicaStatus(str, enum.Enum):
    # Only the two states a replica of ours can be in; Mooncake's FAILED/REMOVED replicas are
    # simply dropped from the object here.
    PROCESSING = "PROCESSING"
    COMPLETE = "COMPLETE"


class ReplicaTier(str, enum.Enum):
    MEMORY = "MEMORY"  # a range of a mounted segment, moved by the transfer engine
    DISK = "LOCAL_DISK"  # a file its segment's owner wrote under offload_dir, read through it


_MEMORY = ReplicaTier.MEMORY.value
_MEMORY_TIER = ReplicaTier.MEMORY
# ``tuple_of(ReplicaDescriptor, fields)``: a named tuple from every one of its fields, built
# without the named tuple's own __new__, which is Python code (for the field defaults) and
# costs about as much again: both ends build one per object of every put and get answer.
tuple_of = tuple.__new__


class ClientStatus(str, enum.Enum):
    OK = "OK"
    NEED_REMOUNT = "NEED_REMOUNT"


@dataclass(frozen=True)
class Segment:
    """What a store client mounts: a range of its memory that other clients read and write."""

    segment_id: str
    name: str  # the transfer-engine segment name data is moved to/from
    base: int
    size: int
    endpoint: str = ""
    host: str = ""
    disk_endpoint: str = ""  # the owner's RPC address serving its SSD tier; empty: none


@dataclass(frozen=True)
class ReplicateConfig:
    replica_num: int = 1
    soft_pin: bool = False
    soft_pin_ttl: float | None = None  # None: the policy's default; clamped to its maximum
    hard_pin: bool = False
    preferred_segments: tuple[str, ...] = ()
    host: str = ""  # the writer's host, for local_first; its own segments count as local anyway


class ReportedObject(NamedTuple):
    """A complete object a re-mounting client still holds in one of its segments.

    A named tuple: the segment's owner records one per object completed in its segment as the
    master's journal reports it (store.segment_owner), on a thread beside its puts, and a frozen
    dataclass took five times as long to build (1.1 against 0.2 us)."""

    key: str
    segment_id: str
    address: int
    size: int
    checksum: int | None = None
    hard_pinned: bool = False


class ReplicaDescriptor(NamedTuple):
    """Where one replica lives: enough for the transfer engine to read or write it.

    A named tuple: a batch answer carries one per object, and a tuple is built, packed (as a
    msgpack array) and rebuilt several times faster than a dataclass."""

    segment_id: str
    segment_name: str
    endpoint: str
    host: str
    address: int
    size: int
    tier: str = ReplicaTier.MEMORY.value  # for DISK, ``endpoint`` is the owner's disk_endpoint
    # For a tenant's client, the master's leave to move this range (transfer.grants); else empty.
    grant: bytes = b""


class ReplicaList(NamedTuple):
    """An object's replicas and the read lease on it. A named tuple like ReplicaDescriptor, for
    the same reason: a batch get answers one per object, packed as a msgpack array of its fields."""

    key: str
    size: int
    replicas: list[ReplicaDescriptor]
    lease_ttl: float  # the reader must finish within this many seconds of asking
    checksum: int | None
    promote: bool = False  # read from disk often enough: the reader should copy it back to memory


# Slots: the master makes one Replica and one ObjectMeta per object of every put (a third less
# time to build than with a __dict__), and reads their fields on every op.
@dataclass(slots=True)
class Replica:
    segment_id: str
    address: int  # 0 for a DISK replica
    status: ReplicaStatus = ReplicaStatus.PROCESSING
    tier: ReplicaTier = ReplicaTier.MEMORY

    @property
    def in_memory(self) -> bool:
        return self.tier is ReplicaTier.MEMORY


@dataclass(slots=True)
class ObjectMeta:
    key: str
    size: int
    owner: str  # the client whose PutStart created it; only it may PutEnd or PutRevoke
    replicas: list[Replica]
    put_start_time: float
    hard_pinned: bool = False
    soft_pin_ttl: float | None = None  # requested; the deadline starts when the object completes
    soft_pin_deadline: float | None = None
    lease_deadline: float = 0.0
    last_access: float = 0.0
    checksum: int | None = None
    disk_reads: int = 0  # leases granted while only disk replicas existed
    promoting: Replica | None = None  # a memory replica being written back from disk
    promoting_owner: str = ""  # the client writing it: only it may end or revoke the promotion
    copying: list[Replica] = field(default_factory=list)  # new replicas a copy writes (store.replication)
    copying_owner: str = ""  # the client copying; empty: no copy in flight
    copy_sources: list[tuple[str, int]] = field(default_factory=list)  # (segment, address) it reads

    @property
    def complete(self) -> bool:
        # A plain loop, not all(<generator>): every op on a key asks, and the generator's set-up
        # cost more than the one or two replicas it looks at.
        for replica in self.replicas:  # noqa: SIM110
            if replica.status is not ReplicaStatus.COMPLETE:
                return False
        return True

    def leased(self, now: float) -> bool:
        return self.lease_deadline > now

    def soft_pinned(self, now: float) -> bool:
        return self.soft_pin_deadline is not None and self.soft_pin_deadline > now


@dataclass
class SegmentState:
    spec: Segment
    client_id: str
    allocator: RangeAllocator

    @property
    def segment_id(self) -> str:
        return self.spec.segment_id

    @property
    def free_ratio(self) -> float:
        return self.allocator.num_free_bytes / self.allocator.capacity if self.allocator.capacity else 0.0

    def describe(self, replica: Replica, size: int) -> ReplicaDescriptor:
        s = self.spec
        if replica.tier is _MEMORY_TIER:  # in_memory, without the property's call
            return tuple_of(ReplicaDescriptor, (s.segment_id, s.name, s.endpoint, s.host, replica.address, size,
                                                 _MEMORY, b""))
        return ReplicaDescriptor(s.segment_id, s.name, s.disk_endpoint, s.host, 0, size, replica.tier.value)


@dataclass
class ClientState:
    client_id: str
    last_seen: float
    # False for a client the master only met through a put: it has not (re)mounted since this
    # master started, so its pings are answered NEED_REMOUNT.
    registered: bool = False
    segment_ids: list[str] = field(default_factory=list)
