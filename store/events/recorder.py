"""The master's KV events as it records them: one list, filled under the store lock, drained after.

Pure: :class:`store.master_state.MasterState` calls :meth:`EventLog.stored` and
:meth:`EventLog.removed` for every complete memory replica that appears or goes (a put ends, a
copy or promotion ends, a re-mounting owner's object is taken back; a remove, an eviction, an
overwrite, a move's dropped source, a segment unmounted or its client expired), and
:meth:`EventLog.cleared_since` when a ``remove_all`` left no complete memory replica. Recording
is a tuple appended to a list: the put path pays nothing else under the lock. The store service
takes the list once per RPC (:meth:`EventLog.take`) and the publisher turns it into one
:class:`store.events.messages.KVEventBatch` (:func:`batch_of`) on its own thread.
"""

from __future__ import annotations

from itertools import groupby
from typing import NamedTuple

from store.events.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KVEventBatch
from store.objects import tuple_of

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"


class StoreEvent(NamedTuple):
    kind: str  # STORED | REMOVED | CLEARED
    key: str = ""
    segment_id: str = ""


class EventLog:
    def __init__(self) -> None:
        self._pending: list[StoreEvent] = []

    def stored(self, key: str, segment_id: str) -> None:
        self._pending.append(tuple_of(StoreEvent, (STORED, key, segment_id)))  # every field: see tuple_of

    def stored_many(self, replicas: list[tuple[str, str]]) -> None:
        """:meth:`stored` for each (key, segment_id), in order (a batch PutEnd's replicas)."""
        self._pending.extend([tuple_of(StoreEvent, (STORED, key, segment_id)) for key, segment_id in replicas])

    def removed(self, key: str, segment_id: str) -> None:
        self._pending.append(tuple_of(StoreEvent, (REMOVED, key, segment_id)))  # every field: see tuple_of

    def mark(self) -> int:
        """A point to come back to with :meth:`cleared_since`."""
        return len(self._pending)

    def cleared_since(self, mark: int) -> None:
        """Everything was removed since ``mark``: one AllBlocksCleared says it instead."""
        del self._pending[mark:]
        self._pending.append(StoreEvent(CLEARED))

    def take(self) -> list[StoreEvent]:
        """The events recorded since the last take, oldest first."""
        taken, self._pending = self._pending, []
        return taken


def batch_of(events: list[StoreEvent], ts: float) -> KVEventBatch:
    """One batch; consecutive events of one kind on one segment share one message (a batch put
    of n keys into one segment is one BlockStored of n hashes)."""
    messages: list[KvEvent] = []
    for (kind, segment_id), run in groupby(events, key=lambda e: (e.kind, e.segment_id)):
        if kind == CLEARED:
            messages.extend(AllBlocksCleared() for _ in run)
            continue
        hashes = [e.key.encode() for e in run]
        messages.append(BlockStored(hashes, segment_id) if kind == STORED else BlockRemoved(hashes, segment_id))
    return KVEventBatch(ts, messages)
