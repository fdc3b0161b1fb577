"""Put and get sessions: ranged, layer-by-layer transfers with one master round trip per object.

A put session reserves each object (our master's put start: its replicas are allocated and stay
PROCESSING, unreadable) without moving any byte; ``batch_put_from_multi_buffer_ranges`` then
writes ranges of registered memory at object offsets into every reserved replica, as often as
the caller likes; ``batch_put_session_end`` commits them (put end) and
``batch_put_session_revoke`` aborts them (put revoke: nothing is left). End and revoke first seal
the session and wait for its range writes in flight. Like the original, a session put computes
no checksum, so its objects are read unchecked.

A get session takes the replica list once (with its read lease) and keeps one complete memory
replica per key; ``batch_get_into_multi_buffer_ranges`` reads ranges of it with no master call,
refusing (LEASE_EXPIRED, dropping the session) once the lease has run out, since the range may
then hold another object. ``batch_get_session_end`` drops the sessions.

Sessions live in this store object, per key, as in the original. Where ours differs: a put
session is a put in flight at our master, so after ``put_start_discard_timeout`` another put of
the same key may take it over; the session's end then fails with OBJECT_NOT_FOUND.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from mooncake._codes import INVALID_PARAMS, code_of, log
from mooncake.store.lifecycle import StoreLifecycle
from store.client import StoreClient
from store.errors import LeaseExpired, ObjectNotFound
from store.objects import ReplicaDescriptor, ReplicaTier
from transfer.batch import OpCode
from transfer.errors import TransferTimeout

INVALID_REPLICA = -702
DRAIN_TIMEOUT = 60.0  # seconds end/revoke wait for range writes in flight; each has its own deadline


@dataclass
class _PutSession:
    replicas: list[ReplicaDescriptor]
    size: int
    writable: bool = True
    in_flight: int = 0


@dataclass
class _GetSession:
    replica: ReplicaDescriptor
    size: int
    deadline: float  # monotonic: the end of the read lease


@dataclass
class _Ranges:
    """One key's ranges, checked: (local address, offset into the object, size)."""

    key: str
    index: int
    ranges: list[tuple[int, int, int]]


class SessionApi(StoreLifecycle):
    def __init__(self) -> None:
        super().__init__()
        self._put_sessions: dict[str, _PutSession] = {}
        self._get_sessions: dict[str, _GetSession] = {}
        self._sessions_changed = threading.Condition()

    def close(self) -> int:
        """Revoke the put sessions still open: their reservations would otherwise stay behind
        until the master takes them back from a silent client."""
        if self._put_sessions and self._client is not None:
            self.batch_put_session_revoke(list(self._put_sessions))
        with self._sessions_changed:
            self._put_sessions.clear()
            self._get_sessions.clear()
        return super().close()

    # -- put sessions ---------------------------------------------------------------------------
    def batch_put_session_start(self, keys: list[str], sizes: list[int], config: Any = None) -> list[int]:
        """Per key 0 (reserved) or a negative code; a key with a session already: INVALID_PARAMS."""
        def call(client: StoreClient) -> list:
            if len(keys) != len(sizes):
                return [INVALID_PARAMS] * len(keys)
            replicate = client.replicate_config(**self._replication(config))
            with self._sessions_changed:
                results: list = [INVALID_PARAMS if key in self._put_sessions else 0 for key in keys]
            picked = [i for i, code in enumerate(results) if code == 0]
            if not picked:
                return results
            started = client.master.batch_put_start([keys[i] for i in picked], [sizes[i] for i in picked], replicate)
            with self._sessions_changed:
                for i, replicas in zip(picked, started):
                    if isinstance(replicas, BaseException):
                        results[i] = replicas
                    else:
                        self._put_sessions[keys[i]] = _PutSession(replicas, sizes[i])
            return results
        return self._ints("batch_put_session_start", len(keys), call)

    def batch_put_from_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]], all_dst_offsets: list[list[int]]) -> list[int]:
        """Per key the bytes written (into every replica), or a negative code; INVALID_PARAMS for
        a key with no writable session or a range outside its object."""
        def call(client: StoreClient) -> list:
            results: list = [INVALID_PARAMS] * len(keys)
            if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_dst_offsets):
                return results
            with self._sessions_changed:
                entries = []
                for entry in _checked(keys, all_buffer_ptrs, all_sizes, all_dst_offsets):
                    session = self._put_sessions.get(entry.key)
                    if session is not None and session.writable and _within(entry, session.size):
                        session.in_flight += 1
                        entries.append((entry, session))
            try:
                for entry, session in entries:
                    results[entry.index] = _move(client, OpCode.WRITE, entry, session.replicas)
            finally:
                with self._sessions_changed:
                    for _, session in entries:
                        session.in_flight -= 1
                    self._sessions_changed.notify_all()
            return results
        return self._ints("batch_put_from_multi_buffer_ranges", len(keys), call)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Per key 0 once its object is readable; a failed key keeps its session (end or revoke
        it again)."""
        return self._finish("batch_put_session_end", keys, lambda client, done: client.master.batch_put_end(
            done, [None] * len(done)))

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        """Per key 0 once its reservation is freed (also when the master has none left)."""
        def revoke(client: StoreClient, done: list[str]) -> list:
            return [None if isinstance(r, ObjectNotFound) else r for r in client.master.batch_put_revoke(done)]
        return self._finish("batch_put_session_revoke", keys, revoke)

    def _finish(self, operation: str, keys: list[str], finish: Any) -> list[int]:
        def call(client: StoreClient) -> list:
            results: list = [INVALID_PARAMS] * len(keys)
            with self._sessions_changed:
                sealed = [i for i, key in enumerate(keys) if key in self._put_sessions]
                for i in sealed:
                    self._put_sessions[keys[i]].writable = False
                drained = self._sessions_changed.wait_for(lambda: all(
                    self._put_sessions[keys[i]].in_flight == 0 for i in sealed if keys[i] in self._put_sessions),
                    timeout=DRAIN_TIMEOUT)
            if not drained:
                return [code_of(TransferTimeout(f"{operation}: range writes still in flight"))
                        if i in sealed else r for i, r in enumerate(results)]
            picked = [i for i in sealed if keys[i] in self._put_sessions]
            if not picked:
                return results
            for i, outcome in zip(picked, finish(client, [keys[i] for i in picked])):
                results[i] = outcome if isinstance(outcome, BaseException) else 0
                if results[i] == 0:
                    with self._sessions_changed:
                        self._put_sessions.pop(keys[i], None)
            return results
        return self._ints(operation, len(keys), call)

    # -- get sessions ---------------------------------------------------------------------------
    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Per key 0 (a complete memory replica and its lease are kept) or a negative code."""
        def call(client: StoreClient) -> list:
            if not keys:
                return []
            asked = time.monotonic()
            lists = client.master.batch_get_replica_list(keys)
            results: list = []
            with self._sessions_changed:
                for key, found in zip(keys, lists):
                    self._get_sessions.pop(key, None)
                    if isinstance(found, BaseException):
                        results.append(found)
                        continue
                    memory = sorted((r for r in found.replicas if r.tier == ReplicaTier.MEMORY.value),
                                    key=lambda r: r.host != client.engine.host_id)  # this host's first
                    if not memory:
                        log.error("batch_get_session_start: %s has no complete memory replica", key)
                        results.append(INVALID_REPLICA)
                        continue
                    self._get_sessions[key] = _GetSession(memory[0], found.size, asked + found.lease_ttl)
                    results.append(0)
            return results
        return self._ints("batch_get_session_start", len(keys), call)

    def batch_get_into_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]], all_src_offsets: list[list[int]]) -> list[int]:
        """Per key the bytes read, or a negative code: INVALID_PARAMS with no session or for a
        range outside the object, LEASE_EXPIRED once the session's lease has run out."""
        def call(client: StoreClient) -> list:
            results: list = [INVALID_PARAMS] * len(keys)
            if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
                return results
            with self._sessions_changed:
                entries = [(entry, self._get_sessions[entry.key])
                           for entry in _checked(keys, all_buffer_ptrs, all_sizes, all_src_offsets)
                           if entry.key in self._get_sessions]
            for entry, session in entries:
                if time.monotonic() < session.deadline and _within(entry, session.size):
                    results[entry.index] = _move(client, OpCode.READ, entry, [session.replica])
                if time.monotonic() >= session.deadline:
                    results[entry.index] = LeaseExpired(f"the lease on {entry.key!r} ran out")
                    with self._sessions_changed:
                        self._get_sessions.pop(entry.key, None)
            return results
        return self._ints("batch_get_into_multi_buffer_ranges", len(keys), call)

    def batch_get_session_end(self, keys: list[str]) -> int:
        def call(client: StoreClient) -> int:
            with self._sessions_changed:
                for key in keys:
                    self._get_sessions.pop(key, None)
            return 0
        return self._int("batch_get_session_end", call)


def _checked(keys: list[str], all_ptrs: list[list[int]], all_sizes: list[list[int]],
             all_offsets: list[list[int]]) -> list[_Ranges]:
    """The keys whose three range lists have one length (the others stay INVALID_PARAMS)."""
    return [_Ranges(key, i, list(zip(ptrs, offsets, sizes)))
            for i, (key, ptrs, sizes, offsets) in enumerate(zip(keys, all_ptrs, all_sizes, all_offsets))
            if len(ptrs) == len(sizes) == len(offsets)]


def _within(entry: _Ranges, size: int) -> bool:
    return all(offset >= 0 and length >= 0 and offset + length <= size for _, offset, length in entry.ranges)


def _move(client: StoreClient, opcode: OpCode, entry: _Ranges, replicas: list[ReplicaDescriptor]) -> Any:
    """The bytes one key's ranges moved to or from every replica, or the first error."""
    try:
        for address, _, length in entry.ranges:
            client.engine.check_address(address, max(length, 1))
    except Exception as exc:
        return exc
    errors = client.move_ranges(opcode, [(address, replica, offset, length) for replica in replicas
                                         for address, offset, length in entry.ranges])
    return next((e for e in errors if e is not None), sum(length for _, _, length in entry.ranges))
