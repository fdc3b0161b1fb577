"""SIEVE eviction (Zhang et al., NSDI'24), the policy of Mooncake's endpoint store.

One FIFO queue (new keys enter at the head) and a *hand* that walks from the tail towards the
head. A hit only sets the key's visited bit, so hits never reorder the queue. To make room the
hand clears visited bits as it passes and evicts the first unvisited key, then rests on that
key's neighbour towards the head; past the head it wraps to the tail. Pure: no I/O, no locks
(callers that share a cache between threads hold their own lock).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar
from collections.abc import Hashable, Iterator

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Node:
    __slots__ = ("key", "value", "visited", "newer", "older")

    def __init__(self, key: Any, value: Any) -> None:
        self.key, self.value, self.visited = key, value, False
        self.newer: _Node | None = None  # towards the head
        self.older: _Node | None = None  # towards the tail


class SieveCache(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._nodes: dict[K, _Node] = {}
        self._head: _Node | None = None  # newest
        self._tail: _Node | None = None  # oldest
        self._hand: _Node | None = None

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: K) -> bool:
        return key in self._nodes

    def get(self, key: K) -> V | None:
        """The value on a hit (marking it visited), None on a miss."""
        node = self._nodes.get(key)
        if node is None:
            return None
        node.visited = True
        return node.value

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Insert a new key at the head; returns what had to be evicted to make room."""
        if key in self._nodes:
            self._nodes[key].value = value
            return []
        evicted = []
        while len(self._nodes) >= self.capacity:
            evicted.append(self._evict())
        node = _Node(key, value)
        node.older = self._head
        if self._head is not None:
            self._head.newer = node
        self._head = node
        if self._tail is None:
            self._tail = node
        self._nodes[key] = node
        return evicted

    def pop(self, key: K) -> V | None:
        """Remove a key outright (a failed endpoint), not counted as an eviction."""
        node = self._nodes.get(key)
        if node is None:
            return None
        if self._hand is node:
            self._hand = node.newer
        self._unlink(node)
        return node.value

    def keys(self) -> Iterator[K]:
        """Keys from head (newest) to tail (oldest)."""
        node = self._head
        while node is not None:
            yield node.key
            node = node.older

    def values(self) -> list[V]:
        return [node.value for node in self._nodes.values()]

    def _evict(self) -> tuple[K, V]:
        node = self._hand or self._tail
        assert node is not None
        while node.visited:
            node.visited = False
            node = node.newer or self._tail
            assert node is not None
        self._hand = node.newer
        self._unlink(node)
        return node.key, node.value

    def _unlink(self, node: _Node) -> None:
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._head = node.older
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._tail = node.newer
        del self._nodes[node.key]
