"""The calls on registered memory named by raw address: no Python object holds the bytes.

``register_buffer(ptr, n)`` makes [ptr, +n) usable; every address these calls take must lie in
such a range, else the key's result is ADDRESS_NOT_REGISTERED (-3). Single-range puts and gets
move the bytes between that memory and the replicas directly. A key spread over several ranges
(``*_multi_buffers``, vLLM's per-layer KV blocks) or read in pieces (``get_into_ranges``) is
gathered into, or scattered from, one staging buffer per call: our store client writes and
reads each replica as one contiguous range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mooncake._codes import INVALID_PARAMS, code_of, log, logged
from mooncake._raw_memory import address_of_bytes, array_at, check_host, copy
from mooncake.store.bytes_api import BytesApi
from mooncake.store.lifecycle import put_code
from store.client import StoreClient


class ZeroCopyApi(BytesApi):
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        def call(client: StoreClient) -> int:
            check_host(buffer_ptr, size, "register_buffer", INVALID_PARAMS)
            array = array_at(buffer_ptr, size)
            client.register_buffer(array)
            self._registered[buffer_ptr] = array
            return 0
        return self._int("register_buffer", call)

    def unregister_buffer(self, buffer_ptr: int) -> int:
        def call(client: StoreClient) -> int:
            client.unregister_buffer(buffer_ptr)
            self._registered.pop(buffer_ptr, None)
            return 0
        return self._int("unregister_buffer", call)

    # -- one range per key ----------------------------------------------------------------------
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self.batch_put_from([key], [buffer_ptr], [size], config)[0]

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: Any = None) -> int:
        """One object: the ``metadata_size`` bytes at ``metadata_buffer_ptr``, then the ``size``
        bytes at ``buffer_ptr``, both registered memory. 0 for an empty ``size`` (nothing is
        stored), as the original. A failure is the negative code, as everywhere here (the
        original negates it once more, to a positive number)."""
        if size == 0:
            log.warning("put_from_with_metadata(%s): empty data, nothing stored", key)
            return 0
        parts = [(ptr, n) for ptr, n in ((metadata_buffer_ptr, metadata_size), (buffer_ptr, size)) if n]
        return self.batch_put_from_multi_buffers([key], [[ptr for ptr, _ in parts]], [[n for _, n in parts]],
                                                 config)[0]

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        """Like put_from, but replaces an existing object instead of keeping it."""
        return self.batch_upsert_from([key], [buffer_ptr], [size], config)[0]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into [buffer_ptr, +size), or a negative code."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: Any = None) -> list[int]:
        return self._batch_from("batch_put_from", keys, buffer_ptrs, sizes, config, upsert=False)

    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: Any = None) -> list[int]:
        return self._batch_from("batch_upsert_from", keys, buffer_ptrs, sizes, config, upsert=True)

    def _batch_from(self, operation: str, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                    config: Any, upsert: bool) -> list[int]:
        def call(client: StoreClient) -> list[int]:
            _same_length(keys, buffer_ptrs, sizes)
            if not keys:
                return []
            replication = self._replication(config)
            return self._upserted(client, keys, upsert, lambda picked: [put_code(r) for r in client.batch_put_from(
                [keys[i] for i in picked], [buffer_ptrs[i] for i in picked], [sizes[i] for i in picked],
                upsert=upsert, **replication)])
        return self._ints(operation, len(keys), call)

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        def call(client: StoreClient) -> list:
            _same_length(keys, buffer_ptrs, sizes)
            for ptr, size in zip(buffer_ptrs, sizes):
                client.engine.check_address(ptr, max(size, 1))
            return client.batch_get_into(keys, buffer_ptrs, sizes)
        return self._ints("batch_get_into", len(keys), call)

    # -- several ranges per key -----------------------------------------------------------------
    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: Any = None) -> list[int]:
        def call(client: StoreClient) -> list:
            _same_length(keys, all_buffer_ptrs, all_sizes)
            checked = _check_ranges(client, all_buffer_ptrs, all_sizes)
            ok = [i for i, error in enumerate(checked) if error is None]
            with _Staging(client, sum(sum(all_sizes[i]) for i in ok)) as staging:
                addresses = [staging.gather(all_buffer_ptrs[i], all_sizes[i]) for i in ok]
                stored = client.batch_put_from([keys[i] for i in ok], addresses,
                                               [sum(all_sizes[i]) for i in ok], **self._replication(config))
            for i, result in zip(ok, stored):
                checked[i] = put_code(result)
            return [code_of(r) if isinstance(r, BaseException) else r for r in checked]
        return self._ints("batch_put_from_multi_buffers", len(keys), call)

    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Per key the bytes read, filling its ranges in order; a negative code on failure.
        ``prefer_alloc_in_same_node`` is the original's NUMA hint for its staging; ours is one
        buffer per call."""
        def call(client: StoreClient) -> list:
            _same_length(keys, all_buffer_ptrs, all_sizes)
            results: list[Any] = _check_ranges(client, all_buffer_ptrs, all_sizes)
            ok = [i for i, error in enumerate(results) if error is None]
            with _Staging(client, sum(sum(all_sizes[i]) for i in ok)) as staging:
                addresses = [staging.reserve(sum(all_sizes[i])) for i in ok]
                read = client.batch_get_into([keys[i] for i in ok], addresses, [sum(all_sizes[i]) for i in ok])
                for i, address, size in zip(ok, addresses, read):
                    if not isinstance(size, BaseException):
                        _scatter(address, size, all_buffer_ptrs[i], all_sizes[i])
                    results[i] = size
            return results
        return self._ints("batch_get_into_multi_buffers", len(keys), call)

    def get_into_ranges(self, buffer_ptrs: list[int], all_keys: list[list[str]],
                        all_dst_offsets: list[list[list[int]]], all_src_offsets: list[list[list[int]]],
                        all_sizes: list[list[list[int]]]) -> list[list[list[int]]]:
        """For buffer b and its key k, copy object bytes [src, +size) to buffer_ptrs[b] + dst for
        each range; results[b][k][r] is the bytes copied or a negative code."""
        try:
            client = self._require()
            _same_length(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)
            wanted = list(dict.fromkeys(key for keys in all_keys for key in keys))
            objects = dict(zip(wanted, client.batch_get(wanted)))
        except Exception as exc:
            code = logged("get_into_ranges", exc)
            return [[[code] * len(sizes) for sizes in groups] for groups in all_sizes]
        return [[_copy_ranges(client, objects[key], base, dsts, srcs, sizes)
                 for key, dsts, srcs, sizes in zip(keys, dst_groups, src_groups, size_groups)]
                for base, keys, dst_groups, src_groups, size_groups
                in zip(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)]


def _same_length(*lists: list) -> None:
    if len({len(items) for items in lists}) > 1:
        raise ValueError("the argument lists must have the same length")


def _check_ranges(client: StoreClient, all_ptrs: list[list[int]], all_sizes: list[list[int]]) -> list:
    """Per key None when every range is registered memory, else the error."""
    checked: list = []
    for ptrs, sizes in zip(all_ptrs, all_sizes):
        try:
            _same_length(ptrs, sizes)
            if not sizes or min(sizes) <= 0:
                raise ValueError("every range needs a positive size")
            for ptr, size in zip(ptrs, sizes):
                client.engine.check_address(ptr, size)
            checked.append(None)
        except Exception as exc:
            checked.append(exc)
    return checked


def _scatter(address: int, size: int, ptrs: list[int], sizes: list[int]) -> None:
    offset = 0
    for ptr, length in zip(ptrs, sizes):
        length = min(length, size - offset)
        if length <= 0:
            return
        copy(ptr, address + offset, length)
        offset += length


def _copy_ranges(client: StoreClient, value: Any, base: int, dsts: list[int], srcs: list[int],
                 sizes: list[int]) -> list[int]:
    """One key's ranges; lists of unequal length fail every range (the longest list's count)."""
    if not len(dsts) == len(srcs) == len(sizes):
        return [INVALID_PARAMS] * max(len(dsts), len(srcs), len(sizes))
    return [_copy_range(client, value, base + dst, src, size) for dst, src, size in zip(dsts, srcs, sizes)]


def _copy_range(client: StoreClient, value: Any, destination: int, source: int, size: int) -> int:
    if isinstance(value, BaseException):
        return code_of(value)
    if source < 0 or size <= 0 or source + size > len(value):
        return INVALID_PARAMS
    try:
        client.engine.check_address(destination, size)
    except Exception as exc:
        return code_of(exc)
    copy(destination, address_of_bytes(value) + source, size)
    return size


class _Staging:
    """One registered buffer for a call, handed out in consecutive pieces."""

    def __init__(self, client: StoreClient, size: int) -> None:
        self.client = client
        self.array = np.empty(max(size, 1), dtype=np.uint8)
        self.offset = 0

    def __enter__(self) -> _Staging:
        self.base = self.client.register_buffer(self.array)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.unregister_buffer(self.base)

    def reserve(self, size: int) -> int:
        address = self.base + self.offset
        self.offset += size
        return address

    def gather(self, ptrs: list[int], sizes: list[int]) -> int:
        address = self.reserve(sum(sizes))
        offset = address
        for ptr, size in zip(ptrs, sizes):
            copy(offset, ptr, size)
            offset += size
        return address
