"""Named shared-memory regions: files in /dev/shm mapped with mmap.

We use plain files rather than multiprocessing.shared_memory because Python 3.11's resource
tracker unlinks a region when *any* process that attached it exits, which would destroy a
target's memory when an initiator goes away. Here exactly one owner creates and unlinks a
region; peers only attach. The owner's pid is part of the name, so a later engine can remove
regions whose owner died without cleaning up (killed with SIGKILL). An engine started by a
cluster names its regions with the cluster's prefix instead of ``mooncake-te-`` (both have the
form ``mooncake-<tag>-<pid>-...``), so `mooncake down` also finds what a killed daemon left.
"""

from __future__ import annotations

import mmap
import os
import re

SHM_DIR = "/dev/shm"
PREFIX = "mooncake-te-"
_OWNED = re.compile(r"^mooncake-[0-9A-Za-z]+-(\d+)-")


class SharedRegion:
    """One mapping of a /dev/shm file. ``owner`` regions unlink the file when closed."""

    def __init__(self, name: str, size: int, *, create: bool) -> None:
        self.name, self.size, self.owner = name, size, create
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise FileNotFoundError(f"{path} is smaller than the {size} bytes described")
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
        except BaseException:
            if create:
                os.unlink(path)
            os.close(fd)
            raise
        if create:
            os.close(fd)  # the mapping keeps the memory
            self._fd = -1
        else:
            self._fd = fd  # kept to notice when the owner unlinks the region (see unlinked)
        self.view = memoryview(self._map)

    def unlinked(self) -> bool:
        """For an attached region: whether its owner has removed it (closed or restarted)."""
        return self._fd >= 0 and os.fstat(self._fd).st_nlink == 0

    @staticmethod
    def owned_name(tag: str, index: int, prefix: str = PREFIX) -> str:
        return f"{prefix}{os.getpid()}-{tag}-{index}"

    def close(self) -> None:
        """Unlink (owner) and unmap. A caller still holding an array over the memory keeps the
        mapping alive until that array is garbage; the file name is gone either way."""
        if self._map is None:
            return
        if self.owner:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass
        try:
            self.view.release()
            self._map.close()
        except BufferError:
            pass  # exported views remain; the mmap object unmaps when the last one is collected
        self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def remove_orphans() -> list[str]:
    """Unlink regions whose owning process no longer exists; returns their names."""
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        match = _OWNED.match(name)
        if match and not _alive(int(match.group(1))):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
