"""Typed errors of the store room, with Mooncake's own codes where it has one.

Each class registers its code with :class:`transfer.errors.MooncakeError`, so an error raised by the
master travels as ``{"code", "message"}`` and is raised again as the same class in the client.
A segment the master does not know is the transfer room's :class:`SegmentNotFound` (-210); it is
re-exported here so store code names all its errors from one module.
"""

from __future__ import annotations

from transfer.errors import InvalidArgument, MooncakeError, SegmentNotFound

__all__ = [
    "ChecksumMismatch", "IllegalClient", "InvalidParams", "LeaseExpired", "MooncakeError", "NoAvailableHandle",
    "ObjectAlreadyExists", "ObjectHasLease", "ObjectNotFound", "ReplicaIsNotReady",
    "SegmentAlreadyExists", "SegmentNotFound", "StoreError", "TenantQuotaExceeded",
]


class StoreError(MooncakeError):
    """Base of the store's errors; carries no code of its own (subclasses do)."""


class NoAvailableHandle(StoreError):
    """No segment has a free range large enough, even after evicting what may be evicted."""

    code, name = -200, "NO_AVAILABLE_HANDLE"


class SegmentAlreadyExists(StoreError):
    # Mooncake's code is -102, which the transfer room already uses for SOCKET_ERROR.
    code, name = -211, "SEGMENT_ALREADY_EXISTS"


class InvalidParams(InvalidArgument, StoreError):
    """A request the master refuses to act on: empty key, size <= 0, zero replicas, bad ranges.

    It is an :class:`InvalidArgument` (so callers catching that see it) but travels with
    Mooncake's INVALID_PARAMS code.
    """

    code, name = -600, "INVALID_PARAMS"


class IllegalClient(StoreError):
    """A client acted on something that belongs to another client (PutEnd, unmount)."""

    code, name = -601, "ILLEGAL_CLIENT"


class ReplicaIsNotReady(StoreError):
    """The object exists but no replica is complete yet (its put is in flight)."""

    code, name = -703, "REPLICA_IS_NOT_READY"


class ObjectNotFound(StoreError):
    code, name = -704, "OBJECT_NOT_FOUND"


class ObjectAlreadyExists(StoreError):
    code, name = -705, "OBJECT_ALREADY_EXISTS"


class ObjectHasLease(StoreError):
    """A reader holds a lease on the object, so it may not be removed or overwritten now."""

    code, name = -706, "OBJECT_HAS_LEASE"


class LeaseExpired(StoreError):
    """The read lease ran out before the copy finished; the bytes read may have been reused."""

    code, name = -707, "LEASE_EXPIRED"


class ChecksumMismatch(StoreError):
    """Every replica read back differs from the checksum taken at put: the bytes are not returned."""

    # Mooncake has no such code (it does not checksum objects); -720 is outside its ranges.
    code, name = -720, "CHECKSUM_MISMATCH"


class TenantQuotaExceeded(StoreError):
    """The put would take its tenant past its quota, even after evicting what that tenant may
    lose; other tenants' objects are never evicted for it."""

    code, name = -1700, "TENANT_QUOTA_EXCEEDED"
