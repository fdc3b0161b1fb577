"""The answers of the master's drain ops (``store.drain_*``), as dataclasses both ends share.

Decoding is strict, as in :mod:`store.wire`: a field missing or of the wrong type raises
:class:`InvalidParams`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from store.errors import InvalidParams

T = TypeVar("T")


@dataclass(frozen=True)
class DrainPlan:
    """What a drain of ``segment_id`` has to do, counted when it starts."""

    segment_id: str
    num_only_here: int  # complete objects held on no other segment: the ones to move
    bytes_only_here: int
    num_elsewhere: int  # complete objects also held elsewhere: nothing to move
    num_in_flight: int  # puts still writing a replica there: moved once they complete
    num_disk_only: int  # held only on the segment's SSD tier, which a drain does not move
    free_elsewhere: int  # free bytes on the segments that may take them


@dataclass(frozen=True)
class DrainPending:
    """One page of what is left on a draining segment."""

    to_move: list[str]  # complete, held only there: move each
    in_flight: list[str]  # being written there: wait, then move
    disk_only: list[str]  # only on its SSD tier: cannot be moved
    num_only_here: int  # all of them, beyond this page too


@dataclass(frozen=True)
class DrainFinish:
    num_dropped: int  # replicas dropped at the end: their objects were held elsewhere too
    unmount_in: float  # seconds until the leases on dropped replicas ran out; then the owner unmounts


@dataclass(frozen=True)
class DrainStatus:
    segment_id: str
    phase: str  # draining, finishing, cancelled, or unmounted (the segment is no longer mounted)
    drainer: str  # the client running the drain; empty once unmounted
    unmount_in: float


def to_wire(message: Any) -> dict:
    return dataclasses.asdict(message)


_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
}


def from_wire(cls: type[T], data: Any) -> T:
    if not isinstance(data, dict):
        raise InvalidParams(f"{cls.__name__} must be a map, got {type(data).__name__}")
    values = {}
    for field in dataclasses.fields(cls):
        value = data.get(field.name)
        if not _CHECKS[field.type](value):
            raise InvalidParams(f"{cls.__name__}.{field.name} must be {field.type}, got {value!r:.100}")
        values[field.name] = value
    return cls(**values)
