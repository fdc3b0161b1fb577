"""The calls that take and return Python bytes-like objects, and existence and removal.

Reads come back as ``bytes`` (b"" on a miss, as the original) or as a :class:`BufferHandle`
(None on a miss). A read takes a read lease on the object, as the original's does: until it
runs out (the master's lease TTL) a plain ``remove`` is refused with OBJECT_HAS_LEASE (-706).
"""

from __future__ import annotations

from typing import Any

from mooncake._codes import logged
from mooncake.store.buffers import BufferHandle, ReplicaDescriptor
from mooncake.store.lifecycle import StoreLifecycle, put_code


class BytesApi(StoreLifecycle):
    # -- puts -----------------------------------------------------------------------------------
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self._put("put", key, value, config, upsert=False)

    def upsert(self, key: str, value: Any, config: Any = None) -> int:
        """Like put, but replaces an existing object instead of keeping it."""
        return self._put("upsert", key, value, config, upsert=True)

    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        """One object whose bytes are the parts one after another (a header and a payload)."""
        try:
            value = b"".join(memoryview(part).cast("B") for part in parts)
        except TypeError as exc:
            return logged("put_parts", exc)
        return self._put("put_parts", key, value, config, upsert=False)

    def _put(self, operation: str, key: str, value: Any, config: Any, upsert: bool) -> int:
        try:
            self._require().put(key, value, upsert=upsert, **self._replication(config))
        except Exception as exc:
            return 0 if put_code(exc) == 0 else logged(operation, exc)
        return 0

    def put_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        """0 when every key was stored (or already there); else the first failure's code."""
        def call(client: Any) -> int:
            if len(keys) != len(values):
                raise ValueError("keys and values must have the same length")
            codes = [put_code(r) for r in client.batch_put(keys, values, **self._replication(config))]
            return next((code for code in codes if code != 0), 0)
        return self._int("put_batch", call)

    # -- gets -----------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        return self.get_batch([key])[0]

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return [b"" if value is None else bytes(value) for value in self._batch_get("get_batch", keys)]

    def get_buffer(self, key: str) -> BufferHandle | None:
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        return [None if value is None else BufferHandle(value)
                for value in self._batch_get("batch_get_buffer", keys)]

    def _batch_get(self, operation: str, keys: list[str]) -> list[bytearray | None]:
        """Each object's bytes, None for a miss (or every key when the call failed)."""
        try:
            results = self._require().batch_get(keys)
        except Exception as exc:
            logged(operation, exc)
            return [None] * len(keys)
        return [None if isinstance(r, BaseException) else r for r in results]

    def get_size(self, key: str) -> int:
        return self._int("get_size", lambda client: client.get_replicas(key).size)

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """The replicas of each key found; keys not found are left out."""
        try:
            lists = self._require().master.batch_get_replica_list(keys)
        except Exception as exc:
            logged("batch_get_replica_desc", exc)
            return {}
        return {key: [ReplicaDescriptor(r) for r in found.replicas]
                for key, found in zip(keys, lists) if not isinstance(found, BaseException)}

    # -- existence and removal ------------------------------------------------------------------
    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, negative on error. Takes no lease."""
        return self._int("is_exist", lambda client: int(client.exists(key)))

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._ints("batch_is_exist", len(keys), lambda client: [int(e) for e in client.batch_exists(keys)])

    def remove(self, key: str, force: bool = False) -> int:
        return self._int("remove", lambda client: client.remove(key, force) or 0)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._ints("batch_remove", len(keys),
                          lambda client: [r if isinstance(r, BaseException) else 0
                                          for r in client.batch_remove(keys, force)])

    def remove_all(self, force: bool = False) -> int:
        """How many objects were removed; leased ones stay unless ``force``."""
        return self._int("remove_all", lambda client: client.remove_all(force))

