"""The tensor calls: torch tensors stored in the original's object format (tensor_codec).

``put_tensor`` stores [metadata][bytes]; ``get_tensor`` returns a new CPU tensor (None on a miss
or bytes that are not a tensor object). The ``*_into`` reads fill registered memory with the
whole object and return a tensor over its data part, so writing to that tensor changes the
buffer (``upsert_tensor_from`` then stores it back); the ``*_from`` writes take a buffer laid
out the same way. ``pub_*`` take a ReplicateConfig; the plain ones use the default.

Tensor parallelism (``*_with_tp``): a write cuts the tensor into ``tp_size`` equal slices along
``split_dim`` and stores slice r under ``<key>_tp_<r>`` for every rank (``tp_rank`` is accepted
and unused, as in the original); a read with ``tp_size > 1`` returns slice ``tp_rank``. A
dimension that does not divide evenly is refused with INVALID_PARAMS (-600), as the original.
A device tensor is copied to host memory by torch before it is stored.
The unified ``*_with_parallelism`` calls (parallel_tensors) read and write the same
``<key>_tp_<rank>`` shards, so objects written by either family are read by the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mooncake._codes import INVALID_PARAMS, OBJECT_NOT_FOUND, log, logged
from mooncake._raw_memory import array_at
from mooncake.store import tensor_codec as codec
from mooncake.store.zero_copy import ZeroCopyApi


def tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


class TensorApi(ZeroCopyApi):
    # -- writes ---------------------------------------------------------------------------------
    def put_tensor(self, key: str, tensor: torch.Tensor) -> int:
        return self._put_tensors("put_tensor", [key], [tensor], None, upsert=False)[0]

    def pub_tensor(self, key: str, tensor: torch.Tensor, config: Any = None) -> int:
        return self._put_tensors("pub_tensor", [key], [tensor], config, upsert=False)[0]

    def upsert_tensor(self, key: str, tensor: torch.Tensor) -> int:
        return self._put_tensors("upsert_tensor", [key], [tensor], None, upsert=True)[0]

    def upsert_pub_tensor(self, key: str, tensor: torch.Tensor, config: Any = None) -> int:
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, upsert=True)[0]

    def batch_put_tensor(self, keys: list[str], tensors_list: list[torch.Tensor]) -> list[int]:
        return self._put_tensors("batch_put_tensor", keys, tensors_list, None, upsert=False)

    def batch_pub_tensor(self, keys: list[str], tensors_list: list[torch.Tensor], config: Any = None) -> list[int]:
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config, upsert=False)

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[torch.Tensor]) -> list[int]:
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, None, upsert=True)

    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[torch.Tensor],
                                config: Any = None) -> list[int]:
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config, upsert=True)

    def _put_tensors(self, operation: str, keys: list[str], tensors: list, config: Any, upsert: bool) -> list[int]:
        if len(keys) != len(tensors):
            return [logged(operation, ValueError("keys and tensors must have the same length"))] * len(keys)
        objects: list[Any] = []
        for tensor in tensors:
            try:
                host = codec.host_tensor(tensor)
                objects.append(codec.header(host) + codec.payload(host))
            except Exception as exc:
                objects.append(exc)
        return self._store_objects(operation, keys, objects, config, upsert)

    def _store_objects(self, operation: str, keys: list[str], objects: list, config: Any, upsert: bool) -> list[int]:
        """Per key 0 or a code; an exception in ``objects`` is that key's failure."""
        ok = [i for i, o in enumerate(objects) if not isinstance(o, BaseException)]
        results = [logged(operation, o) if isinstance(o, BaseException) else 0 for o in objects]
        if ok:
            codes = self._batch_put_codes(operation, [keys[i] for i in ok], [objects[i] for i in ok], config, upsert)
            for i, code in zip(ok, codes):
                results[i] = code
        return results

    # -- tensor parallel writes -----------------------------------------------------------------
    def put_tensor_with_tp(self, key: str, tensor: torch.Tensor, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        return self.batch_pub_tensor_with_tp([key], [tensor], None, tp_rank, tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key: str, tensor: torch.Tensor, config: Any = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        return self.batch_pub_tensor_with_tp([key], [tensor], config, tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[torch.Tensor], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[torch.Tensor], config: Any = None,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """Per base key 0 when all its shards were stored, else the first shard's failure."""
        if tp_size <= 1:
            return self._put_tensors("batch_pub_tensor_with_tp", base_keys, tensors_list, config, upsert=False)
        if len(base_keys) != len(tensors_list):
            return [logged("put_tensor_with_tp", ValueError("keys and tensors must have the same length"))] * len(base_keys)
        keys: list[str] = []
        objects: list[Any] = []
        for key, tensor in zip(base_keys, tensors_list):
            keys += [tp_key(key, rank) for rank in range(tp_size)]
            objects += _shard_objects(tensor, tp_size, split_dim)
        codes = self._store_objects("put_tensor_with_tp", keys, objects, config, upsert=False)
        return [next((c for c in codes[i * tp_size:(i + 1) * tp_size] if c != 0), 0) for i in range(len(base_keys))]

    # -- reads ----------------------------------------------------------------------------------
    def get_tensor(self, key: str) -> torch.Tensor | None:
        return self.batch_get_tensor([key])[0]

    def batch_get_tensor(self, keys: list[str]) -> list[torch.Tensor | None]:
        return [_decode(value) for value in self._batch_get("batch_get_tensor", keys)]

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> torch.Tensor | None:
        return self.get_tensor(key if tp_size <= 1 else tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> list[torch.Tensor | None]:
        return self.batch_get_tensor(base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> torch.Tensor | None:
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int],
                              sizes: list[int]) -> list[torch.Tensor | int | None]:
        """A tensor per key (None where its read failed); arguments the call cannot take (lists
        of different lengths, a null pointer, no setup) give INVALID_PARAMS for every key, as the
        original does."""
        if not len(keys) == len(buffer_ptrs) == len(sizes) or 0 in buffer_ptrs or self._client is None:
            logged("batch_get_tensor_into", ValueError(
                "the argument lists must have the same length, with no null pointer, on a set-up store"))
            return [INVALID_PARAMS] * len(keys)
        read = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [_decode_at(ptr, n) if n > 0 else None for ptr, n in zip(buffer_ptrs, read)]

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> torch.Tensor | None:
        return self.get_tensor_into(key if tp_size <= 1 else tp_key(key, tp_rank), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> list[torch.Tensor | None]:
        keys = base_keys if tp_size <= 1 else [tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # -- writes from registered buffers ---------------------------------------------------------
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensors_from("put_tensor_from", [key], [buffer_ptr], [size], upsert=False)[0]

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensors_from("upsert_tensor_from", [key], [buffer_ptr], [size], upsert=True)[0]

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        return self._tensors_from("batch_put_tensor_from", keys, buffer_ptrs, sizes, upsert=False)

    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]) -> list[int]:
        return self._tensors_from("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, upsert=True)

    def _tensors_from(self, operation: str, keys: list[str], ptrs: list[int], sizes: list[int],
                      upsert: bool) -> list[int]:
        """The buffers must each hold one tensor object; they are stored as they are."""
        if not len(keys) == len(ptrs) == len(sizes):
            return [logged(operation, ValueError("the argument lists must have the same length"))] * len(keys)
        checked = [_check_object(ptr, size) for ptr, size in zip(ptrs, sizes)]
        ok = [i for i, error in enumerate(checked) if error is None]
        results = [0 if error is None else logged(operation, error) for error in checked]
        stored = self._batch_from(operation, [keys[i] for i in ok], [ptrs[i] for i in ok],
                                  [sizes[i] for i in ok], None, upsert) if ok else []
        for i, code in zip(ok, stored):
            results[i] = code
        return results

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                      tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        if tp_size <= 1:
            return self.batch_put_tensor_from(base_keys, buffer_ptrs, sizes)
        tensors: list[Any] = []
        for ptr, size in zip(buffer_ptrs, sizes):
            try:
                tensors.append(_decode_at(ptr, size, strict=True))
            except Exception as exc:
                tensors.append(exc)
        return self.batch_pub_tensor_with_tp(base_keys, tensors, None, tp_rank, tp_size, split_dim)

    # -- safetensors files ----------------------------------------------------------------------
    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Write the tensor under ``key`` to a safetensors file (named ``key`` by default)."""
        from mooncake.store import safetensors_file
        tensor = self.get_tensor(key)
        if tensor is None:
            log.warning("save_tensor_to_safetensor failed (%d): no tensor under %r", OBJECT_NOT_FOUND, key)
            return OBJECT_NOT_FOUND
        try:
            safetensors_file.save({key: tensor}, file_name or key)
        except Exception as exc:
            return logged("save_tensor_to_safetensor", exc)
        return 0

    def load_tensor_from_safetensor(self, key: str | None = None,
                                    file_name: str | None = None) -> torch.Tensor | None:
        """Store the tensor named ``key`` in the file (the file's first tensor if none is) under
        ``key`` (``file_name`` by default) and return it; None when the file cannot be read."""
        from mooncake.store import safetensors_file
        if file_name is None:
            logged("load_tensor_from_safetensor", ValueError("file_name is required"))
            return None
        try:
            tensor = safetensors_file.load_one(file_name, key)
        except Exception as exc:
            logged("load_tensor_from_safetensor", exc)
            return None
        return tensor if self.put_tensor(key or file_name, tensor) == 0 else None


def _shard_objects(tensor: Any, tp_size: int, split_dim: int) -> list:
    """The ``tp_size`` shard objects of one tensor, or its error in every place."""
    try:
        if isinstance(tensor, BaseException):
            raise tensor
        host = codec.host_tensor(tensor)
        objects = []
        for rank in range(tp_size):
            part = codec.shard(host, rank, tp_size, split_dim)
            objects.append(codec.header(part, tuple(host.shape), (codec.Axis(rank, tp_size, split_dim),))
                           + codec.payload(part))
        return objects
    except Exception as exc:
        return [exc] * tp_size


def _decode(value: bytearray | None) -> torch.Tensor | None:
    if value is None:
        return None
    try:
        meta = codec.parse(value)
    except codec.TensorFormatError as exc:
        logged("get_tensor", exc)
        return None
    data = np.frombuffer(value, dtype=np.uint8, count=meta.data_bytes, offset=codec.METADATA_SIZE)
    return codec.tensor_over(meta, data)


def _decode_at(ptr: int, size: int, strict: bool = False) -> torch.Tensor | None:
    """A tensor over the data part of the object at [ptr, +size); it shares that memory."""
    try:
        meta = codec.parse(array_at(ptr, size))
    except (codec.TensorFormatError, ValueError) as exc:
        if strict:
            raise
        logged("get_tensor_into", exc)
        return None
    data = array_at(ptr + codec.METADATA_SIZE, meta.data_bytes) if meta.data_bytes else np.empty(0, np.uint8)
    return codec.tensor_over(meta, data)


def _check_object(ptr: int, size: int) -> BaseException | None:
    try:
        codec.parse(array_at(ptr, size))
        return None
    except Exception as exc:
        return exc

