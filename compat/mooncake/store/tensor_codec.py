"""The original's tensor object format: a 304-byte metadata block, then the tensor's bytes.

    header (40 bytes)  magic "NOOM" (0x4d4f4f4e), version 1, header_size 304, dtype code, ndim,
                       layout kind (0 full, 1 shard), flags, data_offset (304), data_bytes
    layout (264 bytes) global shape[8], local shape[8] (int64, -1 past ndim), axis count, and
                       up to 4 axes {kind (0 DP, 1 TP, 2 EP, 3 PP), index, rank, count,
                       split_dim (-1: none), tag (EP expert_id / PP stage_id, else 0),
                       local extent along split_dim (0 without one)}

All little-endian, as the C++ wheel lays its structs out on x86 and ARM, so objects written by
either are read by the other. Pure: no store, only torch for the tensors.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

MAGIC = 0x4D4F4F4E
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
FULL, SHARD = 0, 1
AXIS_DP, AXIS_TP, AXIS_EP, AXIS_PP = 0, 1, 2, 3
NO_SPLIT = -1

_HEADER = struct.Struct("<IHHiiIIQQ")
_SHAPES = struct.Struct(f"<{MAX_DIMS}q{MAX_DIMS}qII")
_AXIS = struct.Struct("<iiiiiiq")
METADATA_SIZE = _HEADER.size + _SHAPES.size + MAX_AXES * _AXIS.size  # 304

# The original's dtype codes, in order; dtypes this torch lacks keep their code unused.
_DTYPE_NAMES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                "int64", "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
CODE_OF = {getattr(torch, n): code for code, n in enumerate(_DTYPE_NAMES) if hasattr(torch, n)}
DTYPE_OF = {code: dtype for dtype, code in CODE_OF.items()}


class TensorFormatError(ValueError):
    """Bytes that are not a tensor object, or a tensor this format cannot hold."""


@dataclass(frozen=True)
class Axis:
    rank: int
    count: int
    split_dim: int = NO_SPLIT
    kind: int = AXIS_TP
    tag: int = 0


@dataclass(frozen=True)
class TensorMeta:
    dtype: torch.dtype
    shape: tuple[int, ...]  # the local shape: what the bytes hold
    global_shape: tuple[int, ...]
    data_bytes: int
    is_shard: bool = False
    axes: tuple[Axis, ...] = ()


def host_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as contiguous host memory (a device tensor is copied to the host by torch)."""
    if not isinstance(tensor, torch.Tensor):
        raise TensorFormatError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    if tensor.dtype not in CODE_OF:
        raise TensorFormatError(f"dtype {tensor.dtype} has no Mooncake tensor code")
    return tensor.detach().cpu().contiguous()


def payload(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host tensor, without a copy."""
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def header(tensor: torch.Tensor, global_shape: tuple[int, ...] | None = None, axes: tuple[Axis, ...] = ()) -> bytes:
    """The metadata block for ``tensor``: full, or a shard of a tensor of ``global_shape``
    identified by ``axes`` (in the order given, as the original records them)."""
    shape = list(tensor.shape)
    if len(shape) > MAX_DIMS:
        raise TensorFormatError(f"{len(shape)} dimensions; the format holds at most {MAX_DIMS}")
    if len(axes) > MAX_AXES:
        raise TensorFormatError(f"{len(axes)} axes; the format holds at most {MAX_AXES}")
    whole = list(global_shape) if global_shape is not None else shape
    pad = [-1] * (MAX_DIMS - len(shape))
    head = _HEADER.pack(MAGIC, VERSION, METADATA_SIZE, CODE_OF[tensor.dtype], len(shape),
                        SHARD if axes else FULL, 0, METADATA_SIZE, tensor.numel() * tensor.element_size())
    layout = _SHAPES.pack(*(whole + pad), *(shape + pad), len(axes), 0)
    packed_axes = b"".join(
        _AXIS.pack(a.kind, index, a.rank, a.count, a.split_dim, a.tag,
                   shape[a.split_dim] if 0 <= a.split_dim < len(shape) else 0)
        for index, a in enumerate(axes))
    return head + layout + packed_axes + bytes(_AXIS.size * (MAX_AXES - len(axes)))


def parse(view: memoryview | bytes | bytearray) -> TensorMeta:
    """The metadata of a tensor object of exactly ``len(view)`` bytes; TensorFormatError if not one."""
    view = memoryview(view).cast("B")
    if len(view) < METADATA_SIZE:
        raise TensorFormatError(f"{len(view)} bytes are too few for a tensor object")
    magic, version, size, code, ndim, kind, _, offset, data_bytes = _HEADER.unpack_from(view, 0)
    shapes = _SHAPES.unpack_from(view, _HEADER.size)
    global_shape, local_shape, count = shapes[:MAX_DIMS], shapes[MAX_DIMS:2 * MAX_DIMS], shapes[-2]
    if (magic, version, size, offset) != (MAGIC, VERSION, METADATA_SIZE, METADATA_SIZE) or \
            code not in DTYPE_OF or not 0 <= ndim <= MAX_DIMS or kind not in (FULL, SHARD) or \
            count > MAX_AXES or data_bytes != len(view) - offset:
        raise TensorFormatError("not a Mooncake tensor object (bad header)")
    shape = tuple(local_shape[:ndim])
    dtype = DTYPE_OF[code]
    if min(shape + global_shape[:ndim], default=0) < 0 or \
            int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size() != data_bytes:
        raise TensorFormatError("not a Mooncake tensor object (shape and size disagree)")
    axes = []
    for i in range(count):
        axis_kind, _, rank, shard_count, split_dim, tag, _ = _AXIS.unpack_from(
            view, _HEADER.size + _SHAPES.size + i * _AXIS.size)
        axes.append(Axis(rank, shard_count, split_dim, axis_kind, tag))
    return TensorMeta(dtype, shape, tuple(global_shape[:ndim]), data_bytes, kind == SHARD, tuple(axes))


def tensor_over(meta: TensorMeta, data: np.ndarray) -> torch.Tensor:
    """A tensor sharing memory with ``data`` (uint8, exactly ``meta.data_bytes`` long)."""
    if meta.data_bytes == 0:
        return torch.empty(meta.shape, dtype=meta.dtype)
    return torch.from_numpy(data).view(meta.dtype).reshape(meta.shape)


def shard(tensor: torch.Tensor, rank: int, count: int, split_dim: int) -> torch.Tensor:
    """Rank ``rank`` of ``count`` equal slices along ``split_dim``, as the original cuts them
    (it refuses a dimension that does not divide evenly)."""
    if not 0 <= split_dim < tensor.dim() or count <= 0 or not 0 <= rank < count:
        raise TensorFormatError(f"cannot take shard {rank} of {count} along dim {split_dim} "
                                f"of a {tensor.dim()}-d tensor")
    extent = tensor.shape[split_dim]
    if extent % count:
        raise TensorFormatError(f"dim {split_dim} ({extent}) does not split into {count} equal shards")
    step = extent // count
    return tensor.narrow(split_dim, rank * step, step).contiguous()
