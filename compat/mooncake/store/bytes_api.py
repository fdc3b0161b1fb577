"""The calls that take and return Python bytes-like objects, and existence and removal.

Reads come back as ``bytes`` (b"" on a miss, as the original) or as a :class:`BufferHandle`
(None on a miss). A read takes a read lease on the object, as the original's does: until it
runs out (the master's lease TTL) a plain ``remove`` is refused with OBJECT_HAS_LEASE (-706).
"""

from __future__ import annotations

import re
from typing import Any

from mooncake._codes import log, logged
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
        return self._put_parts("put_parts", key, parts, config, upsert=False)

    def upsert_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self._put_parts("upsert_parts", key, parts, config, upsert=True)

    def _put_parts(self, operation: str, key: str, parts: tuple, config: Any, upsert: bool) -> int:
        try:
            value = b"".join(memoryview(part).cast("B") for part in parts)
        except TypeError as exc:
            return logged(operation, exc)
        return self._put(operation, key, value, config, upsert=upsert)

    def _put(self, operation: str, key: str, value: Any, config: Any, upsert: bool) -> int:
        try:
            client = self._require()
            self._check_local_buffer([memoryview(value).nbytes])
            client.put(key, value, upsert=upsert, **self._replication(config))
        except Exception as exc:
            return 0 if put_code(exc) == 0 else logged(operation, exc)
        return 0

    def put_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        """0 when every key was stored (or already there); else the first failure's code."""
        codes = self._batch_put_codes("put_batch", keys, values, config, upsert=False)
        return next((code for code in codes if code != 0), 0)

    def upsert_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        """0 when every key now holds its value; else the first failure's code."""
        codes = self._batch_put_codes("upsert_batch", keys, values, config, upsert=True)
        return next((code for code in codes if code != 0), 0)

    def _batch_put_codes(self, operation: str, keys: list[str], values: list[Any], config: Any,
                         upsert: bool) -> list[int]:
        """Per key 0 or the code of its failure (every key the code when the call failed)."""
        def call(client: Any) -> list[int]:
            if len(keys) != len(values):
                raise ValueError("keys and values must have the same length")
            if not keys:
                return []
            self._check_local_buffer([memoryview(v).nbytes for v in values])
            replication = self._replication(config)
            return self._upserted(client, keys, upsert, lambda picked: [put_code(r) for r in client.batch_put(
                [keys[i] for i in picked], [values[i] for i in picked], upsert=upsert, **replication)])
        return self._ints(operation, len(keys), call)

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

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The replicas of ``key``; [] when it is not found (the original's empty list)."""
        return self.batch_get_replica_desc([key]).get(key, [])

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


    def remove_by_regex(self, regex: str, force: bool = False) -> int:
        """How many objects whose key the regular expression matches (anywhere) were removed."""
        def call(client: Any) -> int:
            pattern = re.compile(regex)
            keys = [row["key"] for row in client.master.inspect("objects") if pattern.search(row["key"])]
            return sum(1 for r in client.batch_remove(keys, force) if not isinstance(r, BaseException)) if keys else 0
        return self._int("remove_by_regex", call)

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """The keys whose replicas were dropped: all of them, or with ``segment_name`` only those
        on that segment. A key whose read lease is still running, or with no replica there, is
        left alone, as the original does.

        Our master drops whole objects only, so a key that also has replicas elsewhere is
        rewritten onto those segments (read, removed, put again with as many replicas)."""
        try:
            client = self._require()
            wanted = set(self._segment_ids([segment_name])) if segment_name else None
        except Exception as exc:
            logged("batch_replica_clear", exc)
            return []
        if wanted is not None and not wanted:
            return []
        cleared = []
        lease_ttl = float(client.master.inspect("counters").get("lease_ttl", 0.0)) if keys else 0.0
        for key in keys:
            try:
                if self._clear_replicas(client, key, wanted, lease_ttl):
                    cleared.append(key)
            except Exception as exc:
                log.info("batch_replica_clear: %s kept (%s)", key, exc)
        return cleared

    def _clear_replicas(self, client: Any, key: str, wanted: set[str] | None, lease_ttl: float) -> bool:
        row = client.master.inspect("key", key)  # no lease, unlike a read
        # The original's objects count as leased for a lease TTL after their put too.
        if row["state"] != "COMPLETE" or row["lease_left"] > 0 or (row["idle"] or 0) < lease_ttl:
            return False
        segments = [r["segment_id"] for r in row["replicas"]]
        others = [s for s in segments if wanted is not None and s not in wanted]
        if wanted is not None and len(others) == len(segments):
            return False
        if not others:
            client.remove(key)
            return True
        value = client.get(key)
        client.remove(key, force=True)
        client.put(key, value, replicas=len(others), preferred_segments=tuple(others))
        return True
