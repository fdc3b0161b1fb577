"""Reading and writing safetensors files, the format the original's safetensor helpers use.

A file is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__"?: {...}}`` padded with spaces to 8 bytes, then
the tensors' bytes. Written here without the ``safetensors`` package: the format is that small,
and files from either side are read by the other.
"""

from __future__ import annotations

import json
import logging
import struct

import numpy as np
import torch

from mooncake.store import tensor_codec as codec

log = logging.getLogger("mooncake")

_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "uint16": "U16",
          "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
NAME_OF = {getattr(torch, n): tag for n, tag in _NAMES.items() if hasattr(torch, n)}
DTYPE_OF = {tag: dtype for dtype, tag in NAME_OF.items()}


def save(tensors: dict[str, torch.Tensor], path: str) -> None:
    header: dict = {}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        host = codec.host_tensor(tensor)
        blob = bytes(codec.payload(host))
        header[name] = {"dtype": NAME_OF[host.dtype], "shape": list(host.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def load_one(path: str, name: str | None) -> torch.Tensor:
    """The tensor ``name`` of the file, or its first tensor (logged) when it has no such one."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length])
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if not entries:
        raise ValueError(f"{path} holds no tensor")
    if name not in entries:
        if name is not None:
            log.warning("%s has no tensor %r; loading its first one, %r", path, name, next(iter(entries)))
        name = next(iter(entries))
    entry = entries[name]
    begin, end = entry["data_offsets"]
    dtype, shape = DTYPE_OF[entry["dtype"]], tuple(entry["shape"])
    if begin == end:
        return torch.empty(shape, dtype=dtype)
    raw = np.frombuffer(bytearray(data[8 + length + begin:8 + length + end]), dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)
