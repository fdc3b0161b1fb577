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

import ctypes
import errno
import mmap
import os
import re
import shutil
import threading

from transfer.errors import SharedMemoryExhausted
from transfer.gpu.device_memory import view_address

SHM_DIR = "/dev/shm"
PREFIX = "mooncake-te-"
_MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module has no constant for it
# Resolved once: a peer's population calls it once per step, 256 times per GiB.
_madvise = ctypes.CDLL(None, use_errno=True).madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_madvise.restype = ctypes.c_int
# A peer maps an attached region this much at a time (0.5-0.6 ms each): closing the region waits
# for one step at most, and so does any mmap() of the process's other threads, which needs the
# address-space lock a step holds. Steps of 4 MiB or 32 MiB populate a GiB equally fast
# (146-154 vs 138-189 ms, /tmp/mb/popstep.py).
POPULATE_STEP = 4 << 20
# A peer waits this long after attaching a region before it maps it ahead: a command that reads
# one object and exits (`mooncake get` of 4 KiB: 0.22-0.26 s without the population, 0.23-0.33
# with it starting at once) is done before it starts; a long-running client pays the first
# writes' faults for this long.
POPULATE_DELAY = 0.25
_OWNED = re.compile(r"^mooncake-[0-9A-Za-z]+-(\d+)-")


class SharedRegion:
    """One mapping of a /dev/shm file. ``owner`` regions unlink the file when closed."""

    def __init__(self, name: str, size: int, *, create: bool, commit: bool = False) -> None:
        """``commit`` (owner only): take the whole region's memory now and map it into this
        process, instead of page by page as it is first written. A /dev/shm too small for it
        then fails here (SharedMemoryExhausted) rather than with a SIGBUS in whichever process
        writes the first page that does not fit, and no write pays a page fault later (on this
        VM a first write into a fresh shared page costs 0.7-1.2 ms per MiB)."""
        self.name, self.size, self.owner = name, size, create
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        self._populating: threading.Thread | None = None
        try:
            if create:
                os.ftruncate(fd, size)
                if commit:
                    _allocate(fd, path, size)
            elif os.fstat(fd).st_size < size:
                raise FileNotFoundError(f"{path} is smaller than the {size} bytes described")
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
            if create and commit:
                _map_every_page(self._map, size)
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
        if not create and os.fstat(fd).st_blocks * 512 >= size:
            self._populate_in_background()

    def _populate_in_background(self) -> None:
        """Map an attached region's pages into this process, from POPULATE_DELAY after the attach.

        Only for a region whose owner committed its memory (every page of the file allocated):
        populating a sparse one would take memory its owner chose not to take. The first write
        into each page of an attached mapping otherwise pays a page fault: 554 us per MiB
        against 140 once mapped, while one madvise maps a GiB in 126-147 ms
        (/tmp/mb/fault.py), so the first puts into another process's segment ran at a quarter
        of the speed of the later ones. The thread releases the GIL in madvise; close() stops
        it between steps. The cost is one core's ~140 ms per GiB, once per attaching process,
        and the page tables every page gets (2 MiB per GiB) now rather than as pages are first
        used; a long-running process that cycles through the pool's memory ends up with the
        same tables either way."""
        self._stop_populating = threading.Event()
        address = view_address(self.view)
        self._populating = threading.Thread(target=self._populate, args=(address,), daemon=True,
                                            name=f"populate-{self.name}")
        self._populating.start()

    def _populate(self, address: int) -> None:
        if self._stop_populating.wait(POPULATE_DELAY):
            return  # closed first: a short-lived process (`mooncake get`) never pays for it
        for offset in range(0, self.size, POPULATE_STEP):
            if self._stop_populating.is_set():
                return
            try:
                _map_pages(address + offset, min(POPULATE_STEP, self.size - offset))
            except OSError:
                return  # an older kernel, or memory pressure: pages are then mapped on first touch

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
        if self._populating is not None:  # madvise must not run on an address no longer mapped
            self._stop_populating.set()
            self._populating.join()
            self._populating = None
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


def _allocate(fd: int, path: str, size: int) -> None:
    """Take the region's pages, refusing first what cannot fit: tmpfs hands out pages one by
    one until it is full, and /dev/shm is usually as large as the machine's memory, so a
    region larger than the free space or than the memory available would first take all the
    memory there is (the kernel then kills some process) before failing."""
    free = shutil.disk_usage(SHM_DIR).free
    if size > free:
        raise SharedMemoryExhausted(_too_big(path, size, f"{SHM_DIR} has {free:,} bytes free"))
    import psutil  # here, not at the top: only a committing owner needs it

    available = psutil.virtual_memory().available
    if size > available:
        raise SharedMemoryExhausted(_too_big(path, size, f"this machine has {available:,} bytes of memory available"))
    try:
        os.posix_fallocate(fd, 0, size)  # releases the GIL while tmpfs hands out the pages
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        free = shutil.disk_usage(SHM_DIR).free  # taken meanwhile by another process
        raise SharedMemoryExhausted(_too_big(path, size, f"{SHM_DIR} has {free:,} bytes free")) from None


def _too_big(path: str, size: int, limit: str) -> str:
    return f"{limit}, too few for {size:,} bytes of {path}: lower the size (--segment-size) or enlarge {SHM_DIR}"


def _map_every_page(region: mmap.mmap, size: int) -> None:
    """Fill this process's page table for the region in one call (MADV_POPULATE_WRITE, Linux
    5.14+), through ctypes so the GIL is released meanwhile; an older kernel leaves the pages to
    be mapped on first touch, which only costs the faults it would have cost anyway."""
    with memoryview(region) as view:  # released at once: an exported view would block close()
        address = view_address(view)
    _map_pages(address, size)


def _map_pages(address: int, size: int) -> None:
    if _madvise(address, size, _MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() != errno.EINVAL:
        raise OSError(ctypes.get_errno(), f"madvise(MADV_POPULATE_WRITE) of {size:,} bytes failed")


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
