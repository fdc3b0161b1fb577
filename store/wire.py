"""The store's messages on the control plane: dataclasses to msgpack maps and back.

Both ends use these, so the master daemon and the library client cannot disagree on a field.
Decoding is strict: anything of the wrong shape raises :class:`InvalidParams`, which the master
returns as an error reply (it never crashes on a peer's bad message). Batch answers carry, per
item, ``{"ok": value}`` or ``{"error": {"code", "name", "message"}}``.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from store.errors import InvalidParams, MooncakeError
from store.objects import (ReplicaDescriptor, ReplicaList, ReplicateConfig, ReportedObject,
                           Segment, tuple_of)
from transfer.errors import error_from_wire


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParams(f"{what} must be an integer, got {type(value).__name__}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidParams(f"{what} must be a string, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise InvalidParams(f"{what} must be a list, got {type(value).__name__}")
    return value


def _map(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise InvalidParams(f"{what} must be a map, got {type(value).__name__}")
    return value


def arg(args: dict, name: str, kind: Callable[[Any, str], Any], default: Any = ...) -> Any:
    """One request argument, type-checked; missing ones raise unless a default is given."""
    if name not in args:
        if default is ...:
            raise InvalidParams(f"missing argument {name!r}")
        return default
    return kind(args[name], name)


def str_arg(args: dict, name: str, default: Any = ...) -> str:
    return arg(args, name, _str, default)


def int_arg(args: dict, name: str, default: Any = ...) -> int:
    return arg(args, name, _int, default)


def bool_arg(args: dict, name: str, default: bool = False) -> bool:
    return bool(args.get(name, default))


# The list arguments are checked in one pass with no call per item (a batch names one per key);
# only a list that fails it is gone through item by item, to name what is wrong.
def str_list_arg(args: dict, name: str) -> list[str]:
    values = arg(args, name, _list)
    if all(type(v) is str for v in values):
        return values
    return [_str(v, name) for v in values]


def int_list_arg(args: dict, name: str) -> list[int]:
    values = arg(args, name, _list)
    if all(type(v) is int for v in values):  # exact: a bool is no integer here
        return values
    return [_int(v, name) for v in values]


def optional_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


# -- dataclasses -------------------------------------------------------------------------------

def config_to_wire(config: ReplicateConfig) -> dict:
    return {"replica_num": config.replica_num, "soft_pin": config.soft_pin,
            "soft_pin_ttl": config.soft_pin_ttl, "hard_pin": config.hard_pin,
            "preferred_segments": list(config.preferred_segments), "host": config.host}


def config_from_wire(data: Any) -> ReplicateConfig:
    data = _map(data, "config")
    ttl = data.get("soft_pin_ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
        raise InvalidParams("soft_pin_ttl must be a number")
    return ReplicateConfig(
        replica_num=int_arg(data, "replica_num", 1), soft_pin=bool_arg(data, "soft_pin"),
        soft_pin_ttl=ttl, hard_pin=bool_arg(data, "hard_pin"),
        preferred_segments=tuple(_str(s, "preferred_segments") for s in data.get("preferred_segments", [])),
        host=str_arg(data, "host", ""))


def segment_to_wire(segment: Segment) -> dict:
    return dict(segment.__dict__)


def segment_from_wire(data: Any) -> Segment:
    data = _map(data, "segment")
    return Segment(str_arg(data, "segment_id"), str_arg(data, "name"), int_arg(data, "base"),
                   int_arg(data, "size"), str_arg(data, "endpoint", ""), str_arg(data, "host", ""),
                   str_arg(data, "disk_endpoint", ""))


def reported_to_wire(report: ReportedObject) -> dict:
    return report._asdict()


def reported_from_wire(data: Any) -> ReportedObject:
    data = _map(data, "object")
    return ReportedObject(str_arg(data, "key"), str_arg(data, "segment_id"), int_arg(data, "address"),
                          int_arg(data, "size"), optional_int(data.get("checksum"), "checksum"),
                          bool_arg(data, "hard_pinned"))


def descriptor_from_wire(data: Any) -> ReplicaDescriptor:
    """A descriptor travels as an array of its fields in order: msgpack packs the named tuple
    so, with no conversion on the master's side. Checked field by field without a loop: a
    batch answer carries one per object."""
    try:
        segment_id, segment_name, endpoint, host, address, size, tier, grant = data
    except (TypeError, ValueError):
        raise InvalidParams(f"replica must be an array of {len(ReplicaDescriptor._fields)} fields") from None
    # Exact types: a bool is no address.
    if not (type(segment_id) is str and type(segment_name) is str and type(endpoint) is str
            and type(host) is str and type(address) is int and type(size) is int and type(tier) is str
            and type(grant) is bytes):
        raise InvalidParams(f"replica fields have the wrong types: {data!r:.200}")
    return tuple_of(ReplicaDescriptor, (segment_id, segment_name, endpoint, host, address, size, tier, grant))


def replica_list_from_wire(data: Any) -> ReplicaList:
    """A replica list travels as an array of its fields in order (the master packs the named
    tuple as it is), checked like a descriptor: a batch answer carries one per object."""
    try:
        key, size, replicas, lease_ttl, checksum, promote = data
    except (TypeError, ValueError):
        raise InvalidParams(f"replica list must be an array of {len(ReplicaList._fields)} fields") from None
    if not (type(key) is str and type(size) is int and type(replicas) is list
            and type(lease_ttl) in (float, int) and (checksum is None or type(checksum) is int)
            and type(promote) is bool):
        raise InvalidParams(f"replica list fields have the wrong types: {data!r:.200}")
    # One replica is the common case, per object of a batch: no comprehension for it.
    described = [descriptor_from_wire(replicas[0])] if len(replicas) == 1 else [descriptor_from_wire(r) for r in replicas]
    return tuple_of(ReplicaList, (key, size, described, float(lease_ttl), checksum, promote))


# -- batch answers -------------------------------------------------------------------------------

def batch_to_wire(results: list) -> list[dict]:
    """Per item ``{"ok": value}`` (values pack as they are) or ``{"error": ...}``."""
    return [{"error": r.to_wire()} if isinstance(r, MooncakeError) else {"ok": r} for r in results]


def batch_from_wire(items: list, decode: Callable[[Any], Any] | None = None) -> list:
    """Per item the decoded value (as it came, without ``decode``) or the typed error instance
    (not raised). No call per item where nothing is decoded: a batch answers one per key."""
    if decode is None:
        return [error_from_wire(i["error"]) if "error" in i else i["ok"] for i in items]
    return [error_from_wire(i["error"]) if "error" in i else decode(i["ok"]) for i in items]
