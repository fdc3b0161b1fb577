"""Reading, validating and writing topology matrix files (Mooncake's JSON format).

A matrix file overrides discovery, so a mistake in it would silently send bytes down the wrong
NIC or none at all. Loading therefore checks the whole shape and every name, and fails with the
file, the key and the problem, e.g. ``topo.json: cuda:0: secondary list: unknown device 'mlx5_9'``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from collections.abc import Collection

from topology.errors import TopologyError
from topology.matrix import Matrix

# "cpu:<numa node>", "cuda:<gpu index>" (or another accelerator prefix Mooncake knows, such as
# "musa:0"), and "*", Mooncake's wildcard location.
_LOCATION = re.compile(r"^(\*|[a-z]+:\d+)$")
_WHOLE_FILE = "(file)"


def parse_matrix(data: Any, path: str, known: Collection[str] | None = None) -> Matrix:
    """Validate decoded JSON as a matrix. ``known`` are the device names this host has; None
    checks the shape only (a file written for another host)."""
    if not isinstance(data, dict):
        raise TopologyError(path, _WHOLE_FILE, f"expected a JSON object of locations, got {_kind(data)}")
    if not data:
        raise TopologyError(path, _WHOLE_FILE, "no locations")
    matrix: Matrix = {}
    for key, value in data.items():
        if not _LOCATION.match(key):
            raise TopologyError(path, key, "not a location (expected cpu:<node>, cuda:<index> or *)")
        if not isinstance(value, list) or len(value) != 2:
            raise TopologyError(path, key, f"expected exactly two lists [preferred, secondary], got {_shape(value)}")
        seen: set[str] = set()
        for label, names in zip(("preferred", "secondary"), value):
            if not isinstance(names, list):
                raise TopologyError(path, key, f"{label} list: expected a list of device names, got {_kind(names)}")
            for name in names:
                if not isinstance(name, str) or not name:
                    raise TopologyError(path, key, f"{label} list: expected device names, got {name!r}")
                if known is not None and name not in known:
                    raise TopologyError(path, key, f"{label} list: unknown device {name!r} "
                                                   f"(this host has: {', '.join(sorted(known)) or 'none'})")
                if name in seen:
                    raise TopologyError(path, key, f"{label} list: {name!r} is listed twice")
                seen.add(name)
        matrix[key] = [list(value[0]), list(value[1])]
    return matrix


def load_matrix(path: str | os.PathLike, known: Collection[str] | None = None) -> Matrix:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(str(path), _WHOLE_FILE, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(str(path), _WHOLE_FILE,
                            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    return parse_matrix(data, str(path), known)


def write_matrix(matrix: Matrix, path: str | os.PathLike) -> Path:
    """Write atomically (temp file, then rename), so a reader never sees half a matrix."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(matrix, out, indent=2)
            out.write("\n")
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise
    return target


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(value), type(value).__name__)


def _shape(value: Any) -> str:
    return f"a list of {len(value)}" if isinstance(value, list) else _kind(value)
