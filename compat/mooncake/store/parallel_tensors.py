"""The unified parallel tensor calls (``*_with_parallelism``): shards named by their axes.

A write takes a ``TensorParallelism`` (an ordered list of ``ParallelAxis``: kind "tp", "dp",
"ep" or "pp", rank, size, and split_dim / expert_id / stage_id) or a ``writer_partition``
(any object with rank, size and split_dim), never both (INVALID_PARAMS, -600, as any argument
the original cannot use). Where the objects go, as the original stores them:

    parallelism None          the whole tensor under ``key``
    writer_partition          the tensor's slice ``rank`` of ``size`` along split_dim under
                              ``<key>__writer_<rank>of<size>_sd<dim>``, and a 96-byte manifest
                              (global shape, dtype, split_dim, shard count) under
                              ``<key>__writer_manifest``
    TP alone                  the tensor given, which is the shard itself, under
                              ``<key>_tp_<rank>`` (the legacy ``*_with_tp`` key, so the two
                              families read each other's shards); global shape = its shape with
                              split_dim times size; manifest under ``<key>__parallelism_manifest``
    TP with other axes        the full tensor given is cut: slice tp.rank of tp.size under
                              ``<key>__dp_0of2__tp_1of4_sd1...`` (axes in DP, TP, EP, PP order,
                              ``_sd``/``_eid``/``_sid`` for the fields set), and the manifest
    DP / EP / PP only         the tensor as it is, under that axis key; no manifest

The ``_from`` forms read one tensor object from registered memory. With a TP axis they take the
full tensor and store every TP rank's slice (no manifest), as the original does; the whole-tensor
and axis-only forms store the object under the key above.

Reads take a ``ReadTarget``: "as_stored" (None too) returns the object under ``key``; "shard"
the object stored for exactly those axes (for TP alone also a writer_partition shard), else,
with a TP axis, the slice cut from the reconstructed tensor (so shards written with another TP
size can be read); "full" concatenates all TP shards along split_dim, found through the
manifest's shard count, or for TP alone through the legacy shards' own count; "full" without
parallelism reads the writer_partition shards, or the object under ``key`` where none are.
A read that cannot be done returns None and logs why. Only TP splits a tensor: "full" of an
EP/PP/DP-only layout is None, as in the original, whose planner does not remap across axes either.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from mooncake._codes import INVALID_PARAMS, log, logged
from mooncake._raw_memory import array_at
from mooncake.store import tensor_codec as codec
from mooncake.store.tensors import TensorApi, _decode, _decode_at, tp_key

AXIS_KINDS = {"dp": codec.AXIS_DP, "tp": codec.AXIS_TP, "ep": codec.AXIS_EP, "pp": codec.AXIS_PP}
KIND_NAMES = {code: name for name, code in AXIS_KINDS.items()}
READ_MODES = ("as_stored", "shard", "full")

# The manifest: magic "NAMW", version, header size, dtype, ndim, split_dim, shard count, a zero,
# 4 bytes of padding (the C++ struct aligns the shape), then the global shape as 8 int64s.
MANIFEST_MAGIC = 0x574D414E
_MANIFEST = struct.Struct(f"<IHHiiiii4x{codec.MAX_DIMS}q")


class ParallelAxis:
    """One axis of a shard's identity, with the original's fields and defaults."""

    def __init__(self) -> None:
        self.kind = ""
        self.rank = 0
        self.size = 1
        self.split_dim: int | None = None
        self.expert_id: int | None = None
        self.stage_id: int | None = None

    def __repr__(self) -> str:
        return (f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, split_dim={self.split_dim}, "
                f"expert_id={self.expert_id}, stage_id={self.stage_id})")


class TensorParallelism:
    """The ordered axes that identify a stored or requested shard."""

    def __init__(self) -> None:
        self.axes: list[ParallelAxis] = []

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a read returns: the stored object, one shard, or the whole tensor."""

    def __init__(self) -> None:
        self._mode = "as_stored"
        self.parallelism: TensorParallelism | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        # The original accepts any case and refuses other names when set, not when read.
        if str(value).lower() not in READ_MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = str(value).lower()

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


@dataclass(frozen=True)
class _Axis:
    """A validated axis; ``kind`` is the format's code, so sorting by it is the key order."""
    kind: int
    rank: int
    size: int
    split_dim: int | None = None
    expert_id: int | None = None
    stage_id: int | None = None

    def suffix(self) -> str:
        text = f"{KIND_NAMES[self.kind]}_{self.rank}of{self.size}"
        for tag, value in (("sd", self.split_dim), ("eid", self.expert_id), ("sid", self.stage_id)):
            if value is not None:
                text += f"_{tag}{value}"
        return text

    def stored(self) -> codec.Axis:
        tag = self.expert_id if self.kind == codec.AXIS_EP else self.stage_id if self.kind == codec.AXIS_PP else 0
        return codec.Axis(self.rank, self.size, codec.NO_SPLIT if self.split_dim is None else self.split_dim,
                          self.kind, tag or 0)


@dataclass(frozen=True)
class _Writer:
    rank: int
    size: int
    split_dim: int


class _Refused(ValueError):
    """A request the original refuses; its message is logged once."""


# -- requests -----------------------------------------------------------------------------------
def _optional_int(axis: Any, name: str) -> int | None:
    value = getattr(axis, name, None)
    return None if value is None else int(value)


def _axes_of(parallelism: Any) -> tuple[_Axis, ...]:
    """The validated axes of a TensorParallelism (any object with ``axes``), in the given order."""
    if not hasattr(parallelism, "axes"):
        raise _Refused("TensorParallelism must provide axes")
    axes = []
    for axis in parallelism.axes:
        if not all(hasattr(axis, name) for name in ("kind", "rank", "size")):
            raise _Refused("ParallelAxis must provide kind, rank, and size")
        kind = AXIS_KINDS.get(str(axis.kind).lower())
        if kind is None:
            raise _Refused(f"unsupported axis kind {axis.kind!r}")
        axes.append(_Axis(kind, int(axis.rank), int(axis.size), _optional_int(axis, "split_dim"),
                          _optional_int(axis, "expert_id"), _optional_int(axis, "stage_id")))
    if not axes:
        raise _Refused("parallelism axes cannot be empty")
    if len(axes) > codec.MAX_AXES:
        raise _Refused(f"at most {codec.MAX_AXES} axes")
    if len({a.kind for a in axes}) != len(axes):
        raise _Refused("duplicate axis kinds are not supported")
    for a in axes:
        name = KIND_NAMES[a.kind]
        if not 0 <= a.rank < a.size:
            raise _Refused(f"invalid rank/size for axis {name}")
        if (a.kind == codec.AXIS_TP) != (a.split_dim is not None):
            raise _Refused("a TP axis requires split_dim" if a.kind == codec.AXIS_TP
                           else f"a {name.upper()} axis must not provide split_dim")
        if a.kind == codec.AXIS_EP and a.expert_id is None:
            raise _Refused("an EP axis requires expert_id")
        if a.kind == codec.AXIS_PP and a.stage_id is None:
            raise _Refused("a PP axis requires stage_id")
    return tuple(axes)


def _writer_of(partition: Any) -> _Writer:
    if not all(hasattr(partition, name) for name in ("rank", "size", "split_dim")):
        raise _Refused("writer_partition must provide rank, size, and split_dim")
    writer = _Writer(int(partition.rank), int(partition.size), int(partition.split_dim))
    if not 0 <= writer.rank < writer.size or writer.split_dim < 0:
        raise _Refused("invalid writer partition")
    return writer


def _write_request(parallelism: Any, writer_partition: Any) -> tuple[_Axis, ...] | _Writer | None:
    if writer_partition is not None:
        if parallelism is not None:
            raise _Refused("writer_partition cannot be combined with parallelism")
        return _writer_of(writer_partition)
    return None if parallelism is None else _axes_of(parallelism)


def _tp_of(axes: tuple[_Axis, ...]) -> _Axis | None:
    return next((a for a in axes if a.kind == codec.AXIS_TP), None)


def _canonical(axes: tuple[_Axis, ...]) -> tuple[_Axis, ...]:
    return tuple(sorted(axes, key=lambda a: a.kind))


def _with_tp_rank(axes: tuple[_Axis, ...], rank: int, size: int | None = None) -> tuple[_Axis, ...]:
    return tuple(replace(a, rank=rank, size=a.size if size is None else size) if a.kind == codec.AXIS_TP else a
                 for a in axes)


def _is_tp_alone(axes: tuple[_Axis, ...]) -> bool:
    return len(axes) == 1 and axes[0].kind == codec.AXIS_TP


# -- key names ----------------------------------------------------------------------------------
def parallelism_key(key: str, axes: tuple[_Axis, ...]) -> str:
    if _is_tp_alone(axes):
        return tp_key(key, axes[0].rank)
    return key + "".join("__" + a.suffix() for a in _canonical(axes))


def writer_key(key: str, writer: _Writer) -> str:
    return f"{key}__writer_{writer.rank}of{writer.size}_sd{writer.split_dim}"


def writer_manifest_key(key: str) -> str:
    return f"{key}__writer_manifest"


def parallelism_manifest_key(key: str) -> str:
    return f"{key}__parallelism_manifest"


# -- objects --------------------------------------------------------------------------------------
def _object(tensor: torch.Tensor, global_shape: tuple[int, ...] | None = None,
            axes: tuple[_Axis, ...] = ()) -> bytes:
    return codec.header(tensor, global_shape, tuple(a.stored() for a in axes)) + bytes(codec.payload(tensor))


def _manifest(global_shape: tuple[int, ...], dtype: torch.dtype, split_dim: int, shard_count: int) -> bytes:
    pad = [-1] * (codec.MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(MANIFEST_MAGIC, 1, _MANIFEST.size, codec.CODE_OF[dtype], len(global_shape), split_dim,
                          shard_count, 0, *global_shape, *pad)


@dataclass(frozen=True)
class _Manifest:
    global_shape: tuple[int, ...]
    split_dim: int
    shard_count: int


def _parse_manifest(value: bytearray | None) -> _Manifest | None:
    if value is None or len(value) < _MANIFEST.size:
        return None
    magic, version, size, _, ndim, split_dim, count, _, *shape = _MANIFEST.unpack_from(value)
    if (magic, version, size) != (MANIFEST_MAGIC, 1, _MANIFEST.size) or not 0 <= ndim <= codec.MAX_DIMS \
            or count <= 0 or not 0 <= split_dim < ndim or min(shape[:ndim]) < 0:
        return None
    return _Manifest(tuple(shape[:ndim]), split_dim, count)


def _check_split(shape: tuple[int, ...], split_dim: int, count: int) -> None:
    if not 0 <= split_dim < len(shape):
        raise _Refused(f"split_dim {split_dim} is out of range for a {len(shape)}-d tensor")
    if shape[split_dim] % count:
        raise _Refused(f"only uniform sharding is supported: dim {split_dim} ({shape[split_dim]}) by {count}")


def _tensor_pieces(key: str, tensor: Any, request: tuple[_Axis, ...] | _Writer | None) -> list[tuple[str, bytes]]:
    """The (key, object) pairs one tensor write stores, as the module docstring lays out."""
    host = codec.host_tensor(tensor)
    shape = tuple(host.shape)
    if request is None:
        return [(key, _object(host))]
    if isinstance(request, _Writer):
        _check_split(shape, request.split_dim, request.size)
        part = codec.shard(host, request.rank, request.size, request.split_dim)
        axis = _Axis(codec.AXIS_TP, request.rank, request.size, request.split_dim)
        return [(writer_key(key, request), _object(part, shape, (axis,))),
                (writer_manifest_key(key), _manifest(shape, host.dtype, request.split_dim, request.size))]
    tp = _tp_of(request)
    if tp is None:
        return [(parallelism_key(key, request), _object(host, shape, request))]
    if _is_tp_alone(request):
        # Plain TP keeps the legacy contract: the caller hands over its own shard.
        if not 0 <= tp.split_dim < len(shape):
            raise _Refused(f"split_dim {tp.split_dim} is out of range for a {len(shape)}-d tensor")
        whole = shape[:tp.split_dim] + (shape[tp.split_dim] * tp.size,) + shape[tp.split_dim + 1:]
        return [(parallelism_key(key, request), _object(host, whole, request)),
                (parallelism_manifest_key(key), _manifest(whole, host.dtype, tp.split_dim, tp.size))]
    _check_split(shape, tp.split_dim, tp.size)
    part = codec.shard(host, tp.rank, tp.size, tp.split_dim)
    return [(parallelism_key(key, request), _object(part, shape, request)),
            (parallelism_manifest_key(key), _manifest(shape, host.dtype, tp.split_dim, tp.size))]


def _buffer_pieces(key: str, tensor: torch.Tensor, global_shape: tuple[int, ...],
                   request: tuple[_Axis, ...] | _Writer) -> list[tuple[str, bytes]]:
    """The (key, object) pairs a ``_from`` write stores for the object decoded from a buffer."""
    shape = tuple(tensor.shape)
    tp = None if isinstance(request, _Writer) else _tp_of(request)
    if (isinstance(request, _Writer) or tp is not None) and global_shape != shape:
        # The original slices the buffer by the global shape; a shard object there would be read
        # past its end, so it is refused instead.
        raise _Refused("a writer_partition or TP write from a buffer needs a whole-tensor object")
    if isinstance(request, _Writer):
        return _tensor_pieces(key, tensor, request)
    if tp is None:
        return [(parallelism_key(key, request), _object(tensor, global_shape, request))]
    _check_split(shape, tp.split_dim, tp.size)
    pieces = []
    for rank in range(tp.size):
        axes = _with_tp_rank(request, rank)
        pieces.append((parallelism_key(key, axes), _object(codec.shard(tensor, rank, tp.size, tp.split_dim),
                                                           shape, axes)))
    return pieces


# -- reads ----------------------------------------------------------------------------------------
def _stored_axes(meta: codec.TensorMeta) -> tuple[_Axis, ...] | None:
    """The canonical axes a shard object records (None for a full object)."""
    if not meta.is_shard:
        return None
    axes = []
    for a in meta.axes:
        if a.kind not in KIND_NAMES:
            return None
        axes.append(_Axis(a.kind, a.rank, a.count, a.split_dim if a.split_dim >= 0 else None,
                          a.tag if a.kind == codec.AXIS_EP else None, a.tag if a.kind == codec.AXIS_PP else None))
    return _canonical(tuple(axes))


@dataclass(frozen=True)
class _Loaded:
    raw: bytearray
    meta: codec.TensorMeta

    def tensor(self) -> torch.Tensor:
        data = np.frombuffer(self.raw, dtype=np.uint8, count=self.meta.data_bytes, offset=codec.METADATA_SIZE)
        return codec.tensor_over(self.meta, data)


class ParallelTensorApi(TensorApi):
    # -- writes -------------------------------------------------------------------------------------
    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                    writer_partition: Any = None) -> int:
        return self._write_tensors("put_tensor_with_parallelism", [key], [tensor], [parallelism],
                                   [writer_partition], config, upsert=False)[0]

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None, config: Any = None,
                                       writer_partition: Any = None) -> int:
        return self._write_tensors("upsert_tensor_with_parallelism", [key], [tensor], [parallelism],
                                   [writer_partition], config, upsert=True)[0]

    def batch_put_tensor_with_parallelism(self, keys: list[str], tensors_list: list, parallelisms: Any = None,
                                          config: Any = None, writer_partitions: Any = None) -> list[int]:
        return self._batch_write("batch_put_tensor_with_parallelism", keys, tensors_list, parallelisms,
                                 writer_partitions, config, upsert=False)

    def batch_upsert_tensor_with_parallelism(self, keys: list[str], tensors_list: list, parallelisms: Any = None,
                                             config: Any = None, writer_partitions: Any = None) -> list[int]:
        return self._batch_write("batch_upsert_tensor_with_parallelism", keys, tensors_list, parallelisms,
                                 writer_partitions, config, upsert=True)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                         config: Any = None, writer_partition: Any = None) -> int:
        return self._write_buffers("put_tensor_with_parallelism_from", [key], [buffer_ptr], [size], [parallelism],
                                   [writer_partition], config, upsert=False)[0]

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism: Any = None,
                                            config: Any = None, writer_partition: Any = None) -> int:
        return self._write_buffers("upsert_tensor_with_parallelism_from", [key], [buffer_ptr], [size],
                                   [parallelism], [writer_partition], config, upsert=True)[0]

    def batch_put_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               parallelisms: Any = None, config: Any = None,
                                               writer_partitions: Any = None) -> list[int]:
        return self._batch_write("batch_put_tensor_with_parallelism_from", keys, (buffer_ptrs, sizes),
                                 parallelisms, writer_partitions, config, upsert=False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                                  parallelisms: Any = None, config: Any = None,
                                                  writer_partitions: Any = None) -> list[int]:
        return self._batch_write("batch_upsert_tensor_with_parallelism_from", keys, (buffer_ptrs, sizes),
                                 parallelisms, writer_partitions, config, upsert=True)

    def _batch_write(self, operation: str, keys: list[str], values: list | tuple[list[int], list[int]],
                     parallelisms: Any, writer_partitions: Any, config: Any, upsert: bool) -> list[int]:
        """``values`` is the tensors, or for the ``_from`` forms (buffer_ptrs, sizes). Arguments
        the whole call cannot take give INVALID_PARAMS for every key, as the original."""
        from_buffers = isinstance(values, tuple)
        count = len(values[0]) if from_buffers else len(values)
        try:
            if parallelisms is not None and writer_partitions is not None:
                raise _Refused("writer_partitions cannot be combined with parallelisms")
            if count != len(keys) or (from_buffers and len(values[1]) != len(keys)):
                raise _Refused("values and keys must have the same length")
            for name, requests in (("parallelisms", parallelisms), ("writer_partitions", writer_partitions)):
                if requests is not None and (not isinstance(requests, list) or len(requests) != len(keys)):
                    raise _Refused(f"{name} must be a list as long as keys, or None")
        except _Refused as exc:
            return [logged(operation, exc)] * len(keys)
        per_key_parallelism = parallelisms or [None] * len(keys)
        per_key_writer = writer_partitions or [None] * len(keys)
        if from_buffers:
            return self._write_buffers(operation, keys, values[0], values[1], per_key_parallelism, per_key_writer,
                                       config, upsert)
        return self._write_tensors(operation, keys, values, per_key_parallelism, per_key_writer, config, upsert)

    def _write_tensors(self, operation: str, keys: list[str], tensors: list, parallelisms: list,
                       writers: list, config: Any, upsert: bool) -> list[int]:
        plans: list[Any] = []
        for key, tensor, parallelism, writer in zip(keys, tensors, parallelisms, writers):
            try:
                plans.append(_tensor_pieces(key, tensor, _write_request(parallelism, writer)))
            except Exception as exc:
                plans.append(exc)
        return self._store_pieces(operation, plans, config, upsert)

    def _write_buffers(self, operation: str, keys: list[str], ptrs: list[int], sizes: list[int],
                       parallelisms: list, writers: list, config: Any, upsert: bool) -> list[int]:
        """A whole-object request stores the buffer as it is (one put from registered memory);
        the others decode it and store the objects derived from it."""
        results: list[int | None] = [None] * len(keys)
        plans: list[Any] = []
        direct = []
        for i, (key, ptr, size, parallelism, writer) in enumerate(zip(keys, ptrs, sizes, parallelisms, writers)):
            try:
                request = _write_request(parallelism, writer)
                self._require().engine.check_address(ptr, max(size, 1))
                meta = codec.parse(array_at(ptr, size))
                if request is None:
                    direct.append(i)
                    continue
                plans.append((i, _buffer_pieces(key, _decode_at(ptr, size, strict=True), meta.global_shape, request)))
            except Exception as exc:
                results[i] = logged(operation, exc)
        if direct:
            stored = self._batch_from(operation, [keys[i] for i in direct], [ptrs[i] for i in direct],
                                      [sizes[i] for i in direct], config, upsert)
            for i, code in zip(direct, stored):
                results[i] = code
        for (i, _), code in zip(plans, self._store_pieces(operation, [p for _, p in plans], config, upsert)):
            results[i] = code
        return [INVALID_PARAMS if code is None else code for code in results]

    def _store_pieces(self, operation: str, plans: list, config: Any, upsert: bool) -> list[int]:
        """Per plan 0 when all its objects were stored, else the first failure (an exception in
        ``plans`` is that plan's failure); all objects go in one batch."""
        keys: list[str] = []
        objects: list[bytes] = []
        for plan in plans:
            if not isinstance(plan, BaseException):
                keys += [key for key, _ in plan]
                objects += [obj for _, obj in plan]
        codes = iter(self._store_objects(operation, keys, objects, config, upsert) if keys else [])
        results = []
        for plan in plans:
            if isinstance(plan, BaseException):
                results.append(logged(operation, plan))
                continue
            mine = [next(codes) for _ in plan]
            results.append(next((c for c in mine if c != 0), 0))
        return results

    # -- reads --------------------------------------------------------------------------------------
    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> torch.Tensor | None:
        return _decode(self._read_object("get_tensor_with_parallelism", key, target))

    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[torch.Tensor | None]:
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            log.warning("batch_get_tensor_with_parallelism failed: targets must be a list as long as keys, or None")
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(key, target) for key, target in zip(keys, targets)]

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int,
                                         target: Any = None) -> torch.Tensor | None:
        return self.batch_get_tensor_with_parallelism_into([key], [buffer_ptr], [size],
                                                           None if target is None else [target])[0]

    def batch_get_tensor_with_parallelism_into(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                                               targets: Any = None) -> list[torch.Tensor | None]:
        """A tensor over each buffer's data part (the object, [metadata][data], fills the buffer
        from its start), or None where the read failed or the object does not fit."""
        operation = "batch_get_tensor_with_parallelism_into"
        if not len(keys) == len(buffer_ptrs) == len(sizes) or \
                (targets is not None and (not isinstance(targets, list) or len(targets) != len(keys))):
            log.warning("%s failed: keys, buffer_ptrs, sizes (and targets) must have the same length", operation)
            return [None] * len(keys)
        results: list[torch.Tensor | None] = []
        for i, (key, ptr, size) in enumerate(zip(keys, buffer_ptrs, sizes)):
            value = self._read_object(operation, key, None if targets is None else targets[i])
            results.append(None if value is None else self._fill(operation, key, value, ptr, size))
        return results

    def _fill(self, operation: str, key: str, value: bytearray, ptr: int, size: int) -> torch.Tensor | None:
        try:
            if len(value) > size:
                raise _Refused(f"buffer too small for key {key!r}: {len(value)} bytes in {size}")
            self._require().engine.check_address(ptr, max(size, 1))
        except Exception as exc:
            logged(operation, exc)
            return None
        array_at(ptr, len(value))[:] = np.frombuffer(value, dtype=np.uint8)
        return _decode_at(ptr, len(value))

    def _read_object(self, operation: str, key: str, target: Any) -> bytearray | None:
        """The object ([metadata][data]) a read target names, or None (logged)."""
        try:
            return self._resolve(key, target)
        except Exception as exc:
            logged(operation, exc)
            return None

    def _resolve(self, key: str, target: Any) -> bytearray | None:
        mode, parallelism = "as_stored", None
        if target is not None:
            if not hasattr(target, "mode") or not hasattr(target, "parallelism"):
                raise _Refused("ReadTarget must provide mode and parallelism")
            mode, parallelism = str(target.mode).lower(), target.parallelism
            if mode not in READ_MODES:
                raise _Refused(f"unsupported ReadTarget mode {target.mode!r}")
        if parallelism is None and mode == "as_stored":
            return self._get_raw(key)
        if parallelism is None and mode == "full":
            joined = self._join_writer_shards(key)
            return self._get_raw(key) if joined is None else joined
        if parallelism is None:
            raise _Refused("a shard read requires parallelism")
        axes = _axes_of(parallelism)
        if mode == "as_stored":
            raise _Refused("as_stored takes no parallelism; ask for a shard or the full tensor")
        if mode == "full":
            if _tp_of(axes) is None:
                raise _Refused("full reconstruction requires a TP axis")
            joined = self._join_shards(key, axes)
            if joined is None:
                raise _Refused(f"no complete shard set for {key!r}")
            return bytearray(_object(joined))
        return self._read_shard(key, axes)

    def _read_shard(self, key: str, axes: tuple[_Axis, ...]) -> bytearray | None:
        exact = self._load(parallelism_key(key, axes))
        if exact is not None and _stored_axes(exact.meta) == _canonical(axes):
            return exact.raw
        tp = _tp_of(axes)
        if _is_tp_alone(axes):
            written = self._load(writer_key(key, _Writer(tp.rank, tp.size, tp.split_dim)))
            if written is not None and _stored_axes(written.meta) == axes:
                return written.raw
        if tp is not None:
            joined = self._join_shards(key, axes)
            if joined is not None and joined.dim() > tp.split_dim and joined.shape[tp.split_dim] % tp.size == 0:
                return bytearray(_object(codec.shard(joined, tp.rank, tp.size, tp.split_dim), tuple(joined.shape),
                                         axes))
        if _is_tp_alone(axes):
            # As the legacy get_tensor_with_tp: whatever tensor the rank's key holds.
            return self._get_raw(tp_key(key, tp.rank))
        raise _Refused(f"parallelism metadata mismatch for key {key!r}")

    def _join_shards(self, key: str, axes: tuple[_Axis, ...]) -> torch.Tensor | None:
        """The full tensor from the TP shards of the layout ``axes`` names, or None: through the
        manifest's shard count first, then (TP alone) the count the legacy shards record, else
        the requested TP size."""
        tp = _tp_of(axes)
        manifest = _parse_manifest(self._get_raw(parallelism_manifest_key(key)))
        if manifest is not None and manifest.split_dim == tp.split_dim \
                and manifest.global_shape[manifest.split_dim] % tp.size == 0:
            joined = self._join([_with_tp_rank(axes, r, manifest.shard_count) for r in range(manifest.shard_count)],
                                key, manifest.split_dim)
            if joined is not None:
                return joined
        count = tp.size
        if _is_tp_alone(axes):
            first = self._load(tp_key(key, 0))
            stored = None if first is None else _stored_axes(first.meta)
            if stored is None or len(stored) != 1 or stored[0].kind != codec.AXIS_TP:
                return None
            count = stored[0].size
        return self._join([_with_tp_rank(axes, r, count) for r in range(count)], key, tp.split_dim)

    def _join(self, shard_axes: list[tuple[_Axis, ...]], key: str, split_dim: int) -> torch.Tensor | None:
        """The shards stored for each of ``shard_axes`` (in TP rank order), concatenated, when
        each records exactly those axes and together they make the global shape they record."""
        loaded = self._load_many([parallelism_key(key, axes) for axes in shard_axes])
        if any(item is None or _stored_axes(item.meta) != _canonical(axes) for item, axes in zip(loaded, shard_axes)):
            return None
        return _concatenated(loaded, split_dim)

    def _join_writer_shards(self, key: str) -> bytearray | None:
        manifest = _parse_manifest(self._get_raw(writer_manifest_key(key)))
        if manifest is None:
            return None
        writers = [_Writer(r, manifest.shard_count, manifest.split_dim) for r in range(manifest.shard_count)]
        loaded = self._load_many([writer_key(key, w) for w in writers])
        if any(item is None or _stored_axes(item.meta) != (_Axis(codec.AXIS_TP, w.rank, w.size, w.split_dim),)
               for item, w in zip(loaded, writers)):
            return None
        joined = _concatenated(loaded, manifest.split_dim)
        return None if joined is None else bytearray(_object(joined))

    def _get_raw(self, key: str) -> bytearray | None:
        return self._batch_get("get_tensor_with_parallelism", [key])[0]

    def _load(self, key: str) -> _Loaded | None:
        return self._load_many([key])[0]

    def _load_many(self, keys: list[str]) -> list[_Loaded | None]:
        loaded: list[_Loaded | None] = []
        for raw in self._batch_get("get_tensor_with_parallelism", keys):
            try:
                loaded.append(None if raw is None else _Loaded(raw, codec.parse(raw)))
            except codec.TensorFormatError:
                loaded.append(None)
        return loaded


def _concatenated(loaded: list, split_dim: int) -> torch.Tensor | None:
    tensors = [item.tensor() for item in loaded]
    global_shape = loaded[0].meta.global_shape
    if not 0 <= split_dim < len(global_shape) or any(t.dtype != tensors[0].dtype for t in tensors):
        return None
    joined = torch.cat(tensors, dim=split_dim)
    return joined if tuple(joined.shape) == global_shape else None
