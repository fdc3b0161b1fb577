"""The root of every typed error, and the errors of the transfer room.

Each error class carries a stable numeric ``code`` (Mooncake's own where one exists). Subclasses
register themselves by code, so an error raised by a handler in a daemon travels as
``{"code", "message"}`` and is raised again as the same class in the caller
(:func:`error_from_wire`). Other rooms derive their own hierarchies from :class:`MooncakeError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

_BY_CODE: dict[int, type[MooncakeError]] = {}


class MooncakeError(Exception):
    code: ClassVar[int] = -900
    name: ClassVar[str] = "ERROR"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            return  # a refinement that inherits its parent's code; the parent travels on the wire
        owner = _BY_CODE.setdefault(cls.code, cls)
        if owner is not cls:
            raise TypeError(f"error code {cls.code} of {cls.__name__} already belongs to {owner.__name__}")

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name.lower().replace("_", " "))
        self.message = str(self.args[0])

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "name": self.name, "message": self.message}


def error_from_wire(error: Any) -> MooncakeError:
    """Rebuild the typed exception a peer reported; unknown codes become a plain MooncakeError."""
    if not isinstance(error, dict):
        return RpcError(f"malformed error reply: {error!r}")
    code = error.get("code")
    message = str(error.get("message", ""))
    cls = _BY_CODE.get(code) if isinstance(code, int) else None
    if cls is None:
        exc = MooncakeError(message)
        exc.code = code if isinstance(code, int) else MooncakeError.code  # type: ignore[misc]
        return exc
    exc = cls.__new__(cls)
    MooncakeError.__init__(exc, message)
    return exc


class InvalidArgument(MooncakeError):
    code, name = -1, "INVALID_ARGUMENT"


class SettingError(InvalidArgument):
    """A setting value that does not parse: names the setting, the value and what is accepted."""

    name = "INVALID_SETTING"

    def __init__(self, setting_name: str, value: Any, accepts: str) -> None:
        self.setting_name, self.value, self.accepts = setting_name, value, accepts
        super().__init__(f"invalid value {value!r} for setting '{setting_name}': expected {accepts}")


class TooManyRequests(MooncakeError):
    code, name = -2, "TOO_MANY_REQUESTS"


class AddressNotRegistered(MooncakeError):
    code, name = -3, "ADDRESS_NOT_REGISTERED"


class BatchBusy(MooncakeError):
    code, name = -4, "BATCH_BUSY"


class DeviceNotFound(MooncakeError):
    code, name = -6, "DEVICE_NOT_FOUND"


class AddressOverlapped(MooncakeError):
    code, name = -7, "ADDRESS_OVERLAPPED"


class MemoryLockLimit(MooncakeError):
    """Registering memory for RDMA would pass the locked-memory limit (``ulimit -l``)."""

    code, name = -302, "MEMORY_LOCK_LIMIT"


class SharedMemoryExhausted(MooncakeError):
    """/dev/shm cannot hold a region that was asked to be committed up front (a store segment).
    Mooncake has no such code: its segments are not files in /dev/shm."""

    code, name = -303, "SHARED_MEMORY_EXHAUSTED"


class SocketError(MooncakeError):
    code, name = -102, "SOCKET_ERROR"


class SegmentNotFound(MooncakeError):
    # Mooncake folds this into -200 METADATA, which the store uses for "no space"; ours is distinct.
    code, name = -210, "SEGMENT_NOT_FOUND"


class TransferFailed(MooncakeError):
    code, name = -800, "TRANSFER_FAILED"


class TransferTimeout(TransferFailed):
    """A transfer request's deadline passed before all of its bytes moved."""

    code, name = -801, "TRANSFER_TIMEOUT"


class TableFull(MooncakeError):
    """A registry (segment descriptors, services, HTTP metadata) holds as many entries as its
    setting allows; existing entries can still be replaced. Mooncake has no such code."""

    code, name = -910, "TABLE_FULL"


class RpcError(MooncakeError):
    code, name = -900, "RPC_FAILED"


class RpcTimeout(RpcError):
    code, name = -901, "RPC_TIMEOUT"


class MalformedMessage(RpcError):
    code, name = -902, "MALFORMED_MESSAGE"


class UnknownOperation(RpcError):
    code, name = -903, "UNKNOWN_OPERATION"


class MessageTooLarge(RpcError):
    code, name = -904, "MESSAGE_TOO_LARGE"


class ShuttingDown(RpcError):
    code, name = -905, "SHUTTING_DOWN"


class NotLeader(RpcError):
    """A standby master (or one that lost its etcd lease) refuses store and metadata ops: the
    caller should find the current leader and ask it instead."""
    code, name = -907, "NOT_LEADER"


class AuthenticationFailed(RpcError):
    """The peer did not prove it holds the cluster secret (or we hold none and it asks for one)."""

    code, name = -909, "AUTHENTICATION_FAILED"


class Unauthorized(RpcError):
    """The caller proved who it is, but that is not enough for this request: a tenant's
    credential asked for another tenant's keys or for an operation only the cluster secret may
    ask for (mounting segments, quotas, draining, HA)."""

    code, name = -911, "UNAUTHORIZED"


class HandlerFailed(RpcError):
    """The handler raised something that is not a MooncakeError: a bug on the daemon side."""

    code, name = -906, "HANDLER_FAILED"
