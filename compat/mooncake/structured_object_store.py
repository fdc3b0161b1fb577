"""``mooncake.structured_object_store``: the original's column layout inference, only.

The original module stores batches of nested Python rows (verl's DataProto) as named buffers.
Before encoding, it walks the rows: dicts and short lists of containers become interior nodes,
everything else a leaf column, and each leaf column gets a codec chosen from what its non-null
values are. This module provides that walk (``infer_structure``) and that choice
(``_choose_leaf_codec``), with the original's codec names, limits and ``MISSING`` sentinel, so
code and tests that plan layouts with them run unchanged. The bundle store itself (``put`` of
DataProto batches, manifests, parallel chunked transfer) is not provided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import torch
except ImportError:  # torch is optional for the original too: no tensor columns then
    torch = None  # type: ignore[assignment]

MAX_DEPTH = 32  # nesting levels below the root before the walk gives up (ValueError)
MAX_DICT_KEYS = 64  # a dict column with more distinct keys stays one leaf
MAX_LIST_LENGTH = 8  # a list column with a longer row stays one leaf


class _Missing:
    """A key absent from a row's dict (or an index past a row's list), which is not a None."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"


MISSING = _Missing()


@dataclass
class CodecDecision:
    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferredLeaf:
    path: str
    values: list[Any]
    decision: CodecDecision


@dataclass
class InferredNode:
    """A dict (``children``: its keys, sorted) or list (``children``: indexes, ``lengths``: each
    row's length) column; ``row_mask`` says which rows had the container at all."""

    path: str
    node_type: str
    children: list[Any]
    lengths: list[int] | None = None
    row_mask: list[bool] | None = None


def _present(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None and v is not MISSING]


def _is_bytes_like(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_image(value: Any) -> bool:
    # PIL is never imported here: an image is recognised by its class's module.
    return (type(value).__module__ or "").startswith("PIL.") and hasattr(value, "save")


def _is_media_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_image(i) or _is_bytes_like(i) for i in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


def _tensor_rule(rows: list[Any]) -> CodecDecision | None:
    if torch is None or not all(isinstance(v, torch.Tensor) for v in rows):
        return None
    dtypes = sorted({str(v.dtype) for v in rows})
    if len(dtypes) > 1:
        return CodecDecision(False, "ragged_tensor", f"mixed tensor dtype: {dtypes}", "torch.Tensor")
    return CodecDecision(True, "ragged_tensor", "all non-null rows are Tensor", "torch.Tensor",
                         {"dtype": dtypes[0]})


def _ndarray_rule(rows: list[Any]) -> CodecDecision | None:
    if not all(isinstance(v, np.ndarray) for v in rows):
        return None
    if all(np.issubdtype(v.dtype, np.number) for v in rows):
        return CodecDecision(True, "typed_ragged", "all rows are numeric ndarray", "numeric sequence",
                             {"recursive_source": "ndarray"})
    return CodecDecision(False, "msgpack_ragged", "object ndarray rows", "python object")


def _numeric_sequence_rule(rows: list[Any]) -> CodecDecision | None:
    if not all(isinstance(v, (list, tuple)) for v in rows):
        return None
    try:
        dtype = np.result_type(*(np.asarray(v).dtype for v in rows))
    except (TypeError, ValueError, OverflowError):
        return None  # ragged nesting or mixed kinds: a later rule decides
    if not np.issubdtype(dtype, np.number):
        return None
    return CodecDecision(True, "typed_ragged", "all rows are numeric sequences", "numeric sequence",
                         {"dtype": str(dtype)})


def _scalar_rule(rows: list[Any]) -> CodecDecision | None:
    if not all(_is_number(v) for v in rows):
        return None
    return CodecDecision(True, "ndarray", "all rows are numeric scalar", "numeric scalar",
                         {"dtype": str(np.result_type(*rows))})


def _every(predicate: Callable[[Any], bool], codec: str, reason: str, kind: str) -> Callable:
    def rule(rows: list[Any]) -> CodecDecision | None:
        return CodecDecision(True, codec, reason, kind) if all(predicate(v) for v in rows) else None
    return rule


# The first rule that claims the column decides, as in the original; the order matters (a list
# of numbers is a numeric sequence before it is msgpack, bytes are media only inside a list).
_LEAF_RULES: tuple[Callable[[list[Any]], CodecDecision | None], ...] = (
    _tensor_rule,
    _every(_is_media_list, "media_list_ragged", "all rows are media lists", "media list"),
    _ndarray_rule,
    _numeric_sequence_rule,
    _scalar_rule,
    _every(_is_bytes_like, "bytes_ragged", "all rows are bytes-like", "bytes-like"),
    _every(_is_image, "media_bytes", "all rows are media", "media"),
    _every(lambda v: isinstance(v, str), "utf8_ragged", "all rows are str", "str"),
    _every(lambda v: isinstance(v, (dict, list, tuple)), "msgpack_ragged", "all rows are msgpack-like", "msgpack"),
)


def _choose_leaf_codec(values: list[Any]) -> CodecDecision:
    """The codec for one leaf column, from its non-null values; ``accepted`` is False when none
    fits (the original then falls back to pickling the rows)."""
    rows = _present(values)
    if not rows:
        return CodecDecision(False, "msgpack_ragged", "all rows are null", "msgpack")
    for rule in _LEAF_RULES:
        decision = rule(rows)
        if decision is not None:
            return decision
    return CodecDecision(False, "msgpack_ragged", "no codec matched", "python object")


def _escape_key(key: str) -> str:
    """A dict key as one path component: ``.`` and ``[`` (and ``\\`` itself) escaped."""
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _dict_keys(rows: list[Any]) -> list[str] | None:
    if not rows or not all(isinstance(v, dict) for v in rows):
        return None
    keys = {k for v in rows for k in v}
    if len(keys) > MAX_DICT_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_width(rows: list[Any]) -> int | None:
    """The longest row of a column of short lists of containers (or None items); None when the
    column is not one."""
    if not rows or not all(isinstance(v, (list, tuple)) for v in rows):
        return None
    width = max(len(v) for v in rows)
    if width > MAX_LIST_LENGTH:
        return None
    if not all(item is None or isinstance(item, (dict, list, tuple)) for v in rows for item in v):
        return None
    return width


def infer_structure(path: str, values: list[Any], leaves: list[InferredLeaf],
                    nodes: list[InferredNode], *, _depth: int = 0) -> None:
    """Expand the column ``values`` (one value per row) at ``path`` into ``nodes`` (interior,
    appended parent first) and ``leaves``. A row without a parent container gives None below it;
    a dict without the key, or a list shorter than the index, gives ``MISSING``. Child paths are
    ``path.key`` (escaped) and ``path[i]``. Deeper than :data:`MAX_DEPTH` raises ValueError."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"infer_structure exceeded max depth {MAX_DEPTH} at {path!r}")
    rows = _present(values)
    keys = _dict_keys(rows)
    if keys is not None:
        nodes.append(InferredNode(path, "dict", keys, row_mask=[isinstance(v, dict) for v in values]))
        for key in keys:
            column = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{_escape_key(key)}", column, leaves, nodes, _depth=_depth + 1)
        return
    width = _list_width(rows)
    if width is not None:
        is_list = [isinstance(v, (list, tuple)) for v in values]
        nodes.append(InferredNode(path, "list", list(range(width)),
                                  [len(v) if listed else 0 for v, listed in zip(values, is_list)],
                                  row_mask=is_list))
        for index in range(width):
            column = [(v[index] if index < len(v) else MISSING) if listed else None
                      for v, listed in zip(values, is_list)]
            infer_structure(f"{path}[{index}]", column, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(InferredLeaf(path, values, _choose_leaf_codec(values)))
