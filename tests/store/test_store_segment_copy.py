"""Copies into and out of a store client's own segment: the checksum streamed over the copy's
pieces is the object's one-shot xxh3-64, and a batch shared out among threads, or hashed by a
helper as it is copied, lands whole, in order, with each object's digest in its place."""

from __future__ import annotations

import os

import pytest
import xxhash

from store import segment_copy
from store.segment_copy import CHUNK, SegmentCopier, copy_checksummed


@pytest.mark.parametrize("size", [1, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 4321])
def test_the_streamed_checksum_is_the_one_shot_xxh3_of_the_bytes(size):
    source = os.urandom(size)
    target = memoryview(bytearray(size))
    assert copy_checksummed(target, memoryview(source), True) == xxhash.xxh3_64_intdigest(source)
    assert target == source
    target[:] = bytes(size)
    assert copy_checksummed(target, memoryview(source), False) is None
    assert target == source


def _copy_batch(sizes: list[int], threads: int, checksum: bool = True, sources_fixed: bool = False) -> bool:
    """Copy random objects of ``sizes`` with a SegmentCopier of ``threads``; assert each landed
    whole with its digest in its place (None without checksums). Returns whether helper
    threads were started."""
    sources = [os.urandom(n) for n in sizes]
    targets = [memoryview(bytearray(n)) for n in sizes]
    copier = SegmentCopier(threads=threads)
    try:
        digests = copier.copy([(t, memoryview(s)) for t, s in zip(targets, sources)], checksum=checksum,
                              sources_fixed=sources_fixed)
        helped = copier._pool is not None
    finally:
        copier.close()
    assert digests == [xxhash.xxh3_64_intdigest(s) if checksum else None for s in sources]
    assert [bytes(t) for t in targets] == sources
    return helped


def test_a_big_batch_shared_among_threads_comes_back_whole_and_in_order(monkeypatch):
    monkeypatch.setattr(segment_copy, "PARALLEL_BYTES", 1 << 20)  # small objects, quick test
    # more than PARALLEL_BYTES in all
    assert _copy_batch([CHUNK + 7, 5, 1 << 20, 70_001, 2 * CHUNK, 4096], threads=3), "a batch this big is shared out"


def test_one_thread_copies_a_big_batch_alone(monkeypatch):
    monkeypatch.setattr(segment_copy, "PARALLEL_BYTES", 1 << 20)
    assert not _copy_batch([CHUNK + 7, 2 * CHUNK, 5], threads=1)


@pytest.mark.parametrize("checksum", [True, False])
def test_a_batch_on_the_calling_thread_copies_small_and_large_objects_alike(checksum):
    """Objects up to SMALL_COPY are copied inline, bigger ones in hashed pieces: both land whole,
    each digest in its object's place (None without checksums)."""
    sizes = [segment_copy.SMALL_COPY, 1, segment_copy.SMALL_COPY + 1, 4096, CHUNK + 3]
    assert not _copy_batch(sizes, threads=1, checksum=checksum)


@pytest.mark.parametrize("core_free, sources_fixed", [(True, True), (False, True), (True, False)])
def test_a_puts_large_objects_are_hashed_beside_the_copy_while_a_core_is_free(monkeypatch, core_free,
                                                                               sources_fixed):
    """From HASH_BESIDE_BYTES of objects of a CHUNK or more (and up to PARALLEL_BYTES) a helper
    hashes a put's sources while the calling thread copies: digests and bytes are the same as
    on one thread, each in its object's place, small objects among them included. A get's
    (sources not fixed) are hashed where they landed, by the calling thread."""
    monkeypatch.setattr(segment_copy.spin.HEADROOM, "free", lambda: core_free)
    sizes = [5, CHUNK, 4096, CHUNK + 3, 1]  # HASH_BESIDE_BYTES (2 MiB) in two objects
    assert _copy_batch(sizes, threads=2, sources_fixed=sources_fixed) is (core_free and sources_fixed), \
        "the helper hashes only a put's sources, and only while a core is free"


def test_objects_below_a_chunk_are_never_hashed_beside(monkeypatch):
    monkeypatch.setattr(segment_copy.spin.HEADROOM, "free", lambda: True)
    # more than HASH_BESIDE_BYTES, none a CHUNK
    assert not _copy_batch([CHUNK - 1] * 4, threads=2, sources_fixed=True)
