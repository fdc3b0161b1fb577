"""A store client's SSD tier: one file per object under ``<offload_dir>/<client id>/``.

A file is a header (magic, key length, size, xxh3-64 checksum), the UTF-8 key, then the bytes.
It is written to a temporary name and renamed into place, so a crash leaves either no file or a
whole one; a torn or bit-rotted file fails its checksum on read and is reported as such, never
served. The key is kept in the file so a name collision of the hashed file names cannot hand
out another object's bytes.
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
from pathlib import Path

import xxhash

from store.errors import ChecksumMismatch, ObjectNotFound

_HEADER = struct.Struct("<4sIQQ")
_MAGIC = b"MCD1"


class DiskTier:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Cached objects are other users' data: only this daemon's user may list or read them.
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        self._temp_names = itertools.count()

    def write(self, key: str, data: memoryview, checksum: int) -> None:
        name = key.encode()
        final = self._path(key)
        temp = final.with_name(f"{final.name}.tmp{os.getpid()}-{next(self._temp_names)}")
        with open(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(_HEADER.pack(_MAGIC, len(name), data.nbytes, checksum))
            f.write(name)
            f.write(data)
        os.replace(temp, final)

    def read(self, key: str) -> tuple[memoryview, int]:
        """The object's bytes and checksum; ObjectNotFound or ChecksumMismatch."""
        try:
            raw = self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"{key!r} is not in the SSD tier of {self.directory}") from None
        name = key.encode()
        if len(raw) < _HEADER.size:
            raise ChecksumMismatch(f"{key!r}: its file is truncated")
        magic, key_length, size, checksum = _HEADER.unpack_from(raw)
        start = _HEADER.size + key_length
        data = memoryview(raw)[start:]
        if magic != _MAGIC or raw[_HEADER.size:start] != name or data.nbytes != size \
                or xxhash.xxh3_64_intdigest(data) != checksum:
            raise ChecksumMismatch(f"{key!r}: its file is damaged or holds another object")
        return data, checksum

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def destroy(self) -> None:
        """Remove every file: the replicas they back leave the pool with our segment."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _path(self, key: str) -> Path:
        return self.directory / f"{xxhash.xxh3_128_hexdigest(key.encode())}.obj"
