"""A put reservation as both ends see it, and its form on the wire.

Decoding is strict, as in :mod:`store.wire`: a field missing or of the wrong type raises
:class:`InvalidParams`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from store.errors import InvalidParams
from store.objects import ReplicaDescriptor
from store.wire import descriptor_from_wire


class SpaceGrant(NamedTuple):
    """A range granted to one client for its next puts: ``replica`` describes the whole range
    (its address and size), and each object written into it starts at a multiple of
    ``alignment`` from there, as the master's allocator places ranges."""

    reservation_id: int
    replica: ReplicaDescriptor
    alignment: int


def grant_to_wire(grant: SpaceGrant | None) -> list | None:
    # The descriptor is a named tuple: msgpack packs it as an array, as in every put answer.
    return None if grant is None else [grant.reservation_id, grant.replica, grant.alignment]


def grant_from_wire(data: Any) -> SpaceGrant | None:
    if data is None:
        return None
    try:
        reservation_id, replica, alignment = data
    except (TypeError, ValueError):
        raise InvalidParams("a space grant must be an array of 3 fields") from None
    if type(reservation_id) is not int or type(alignment) is not int or alignment <= 0:
        raise InvalidParams(f"space grant fields have the wrong types: {data!r:.200}")
    return SpaceGrant(reservation_id, descriptor_from_wire(replica), alignment)
