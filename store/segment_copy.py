"""Copies between a store client's registered memory and segments it maps, checksummed on the way.

A replica in the client's own segment is memory of this very process, and one in another
process's segment on this host is a shared-memory region this process maps: the bytes need no
transport, only a copy (what the C++ store does with ``memcpy`` for a local segment). Each
object is copied in ``CHUNK`` pieces and each piece is hashed right after it landed, while it is
still in cache, so copy and checksum read the object from memory once; the streamed digest is
the one-shot ``xxh3_64`` of the object. A batch of more than ``PARALLEL_BYTES`` is shared out
among a few threads (numpy's copy and xxhash both release the GIL on pieces this big). Below
that, a put's objects bigger than a piece are hashed from their source by a helper while the
calling thread copies them, when a core is free: a put's buffer does not change while it runs.
Not a get's: its checksum must be of the bytes that landed, since a replica read through a held
lease may be overwritten meanwhile (store.held_leases), and only that digest shows it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait

import xxhash

from transfer.memory import SMALL_COPY, copy_into
from transfer.rpc import spin

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
# From this many bytes in objects of a CHUNK or more, a put's batch up to PARALLEL_BYTES has a
# helper hash their sources while the calling thread copies them: the hash reads an object
# bigger than the L2 back from memory anyway, so two cores share the work instead of one doing
# both. Copied and checksummed into a mapped region on the development VM, one thread vs the
# helper, GB/s (/tmp/cp4.py, cp5.py, session 27): 2 MiB 7.7-8.1 vs 9.9-13.0, 1 MiB x4 7.8-8.1
# vs 10.1, 16 MiB 5.8-6.7 vs 6.2-9.6, 1 MiB x16 6.4-6.8 vs 8.1-9.7; but 1 MiB alone 7.8-10.0
# vs 8.7-11.8 (a wash), 512 KiB 13.5 vs 9.3 and 64 KiB x64 7.5 vs 5.6 (pieces that stay in
# cache hash cheaply where they landed).
HASH_BESIDE_BYTES = 2 << 20

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
    helpers; from HASH_BESIDE_BYTES of large objects whose sources are fixed, a helper hashes
    while it copies (helpers started at the first batch that needs one, stopped by :meth:`close`)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()  # a client may be used from several threads at once

    def copy(self, copies: list[Copy], checksum: bool, sources_fixed: bool = False) -> list[int | None]:
        """Per copy its digest (None without ``checksum``), in order. ``sources_fixed``: the
        sources do not change while they are copied (a put's), so their digests may be taken
        from them rather than from the bytes landed."""
        if self.threads == 1:
            return _copy_all(copies, checksum)
        total = sum(source.nbytes for _, source in copies)
        if total <= PARALLEL_BYTES:
            large = ([n for n, (_, source) in enumerate(copies) if source.nbytes >= CHUNK]
                     if checksum and sources_fixed else [])
            if sum(copies[n][1].nbytes for n in large) >= HASH_BESIDE_BYTES and spin.HEADROOM.free():
                return self._copy_hashed_beside(copies, large)
            return _copy_all(copies, checksum)
        groups = _split(copies, total, self.threads)
        pool = self._helpers()
        helped = [pool.submit(_copy_all, group, checksum) for group in groups[1:]]
        try:
            digests = _copy_all(groups[0], checksum)
        finally:
            wait(helped)  # even when ours failed: no copy may still run once the caller goes on
        for future in helped:
            digests += future.result()
        return digests

    def _copy_hashed_beside(self, copies: list[Copy], large: list[int]) -> list[int | None]:
        """Checksummed copies, the ``large`` ones (their positions) hashed from their sources
        by a helper as this thread copies them; the rest copied and hashed here."""
        hashing = self._helpers().submit(_hash_all, [copies[n][1] for n in large])
        digests: list[int | None] = [None] * len(copies)
        try:
            for n in large:  # first, while the helper reads the same sources
                copy_into(*copies[n])
            hashed_beside = set(large)
            small = [n for n in range(len(copies)) if n not in hashed_beside]
            for n, digest in zip(small, _copy_all([copies[n] for n in small], True)):
                digests[n] = digest
        finally:
            wait([hashing])  # even when ours failed: no hash may still read once the caller goes on
        for n, digest in zip(large, hashing.result()):
            digests[n] = digest
        return digests

    def _helpers(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="store-copy")
            return self._pool

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


def _hash_all(views: list[memoryview]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(view) for view in views]


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
