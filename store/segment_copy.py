"""Copies between a store client's registered memory and segments it maps, checksummed on the way.

A replica in the client's own segment is memory of this very process, and one in another
process's segment on this host is a shared-memory region this process maps: the bytes need no
transport, only a copy (what the C++ store does with ``memcpy`` for a local segment). Each
object is copied in ``CHUNK`` pieces and each piece is hashed right after it landed, while it is
still in cache, so copy and checksum read the object from memory once; the streamed digest is
the one-shot ``xxh3_64`` of the object. A batch of more than ``PARALLEL_BYTES`` is shared out
among a few threads (numpy's copy and xxhash both release the GIL on pieces this big).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait

import xxhash

from transfer.memory import SMALL_COPY, copy_into

# The hash reads each piece right after the copy wrote it, from cache. Not smaller: glibc copies
# pieces from 2 KiB up to about 512 KiB (the L2 size, on AMD) with `rep movsb`, which on this AMD
# EPYC VM ran at 1.4-1.6 GB/s wherever the target lay 8-31 bytes past the source modulo a page
# (a segment's page-aligned range read into a malloc'd buffer, 16 bytes past a page) against
# 5.6-8.0 at other offsets; from 512 KiB its vector loop runs at full speed whatever the offset.
# Copying and hashing 16 MiB out of shared memory into such a buffer in pieces of 256 KiB / 512
# KiB / 1 MiB / 2 MiB ran at 2.1-2.2 / 6.0-6.1 / 5.8-6.0 / 5.8-6.0 GB/s, into shared memory at
# 6.3-6.6 for every size (/work/s25/ck.py and align3.py in the session 25 note).
CHUNK = 1 << 20
# Below this a batch stays on the calling thread. One thread copying and hashing already takes
# most of a small VM's memory bandwidth (14-16 GB/s on the 2-core development VM): a second one
# made 8 MiB batches 25% slower and 32 MiB ones 0-10% faster, and only from 16 MiB up did it
# gain (0-20%, /tmp/local2/copier_threads.py).
PARALLEL_BYTES = 16 << 20

Copy = tuple[memoryview, memoryview]  # (target, source): two byte views of one length


def copy_checksummed(target: memoryview, source: memoryview, checksum: bool) -> int | None:
    """``target[:] = source``; with ``checksum``, returns xxh3-64 of the bytes copied."""
    if not checksum:
        copy_into(target, source)
        return None
    if source.nbytes <= CHUNK:
        copy_into(target, source)
        return xxhash.xxh3_64_intdigest(target)
    state = xxhash.xxh3_64()
    for start in range(0, source.nbytes, CHUNK):
        piece = target[start:start + CHUNK]
        copy_into(piece, source[start:start + CHUNK])
        state.update(piece)
    return state.intdigest()


class SegmentCopier:
    """Copies a batch on the calling thread, or above PARALLEL_BYTES on it and ``threads - 1``
    helpers (started at the first such batch, stopped by :meth:`close`)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # a client may be used from several threads at once

    def copy(self, copies: list[Copy], checksum: bool) -> list[int | None]:
        """Per copy its digest (None without ``checksum``), in order."""
        total = sum(source.nbytes for _, source in copies)
        groups = _split(copies, total, self.threads) if total > PARALLEL_BYTES else [copies]
        if len(groups) == 1:
            return _copy_all(copies, checksum)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="store-copy")
            pool = self._pool
        helped = [pool.submit(_copy_all, group, checksum) for group in groups[1:]]
        try:
            digests = _copy_all(groups[0], checksum)
        finally:
            wait(helped)  # even when ours failed: no copy may still run once the caller goes on
        for future in helped:
            digests += future.result()
        return digests

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _copy_all(copies: list[Copy], checksum: bool) -> list[int | None]:
    digests: list[int | None] = []
    for target, source in copies:
        if source.nbytes <= SMALL_COPY:  # copy_checksummed's work, without two calls per small object
            target[:] = source
            digests.append(xxhash.xxh3_64_intdigest(target) if checksum else None)
        else:
            digests.append(copy_checksummed(target, source, checksum))
    return digests


def _split(copies: list[Copy], total: int, parts: int) -> list[list[Copy]]:
    """Consecutive runs of ``copies`` of about ``total / parts`` bytes each (an object is never
    split: its digest is one stream), so the results concatenate back in order."""
    share = -(-total // parts)
    groups: list[list[Copy]] = [[]]
    filled = 0
    for copy in copies:
        if filled >= share and len(groups) < parts:
            groups.append([])
            filled = 0
        groups[-1].append(copy)
        filled += copy[1].nbytes
    return groups
