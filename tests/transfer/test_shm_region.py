"""Shared-memory regions committed up front (store segments) and left to fill lazily."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from tests.conftest import require_program
from transfer.errors import SharedMemoryExhausted
from transfer.shm import region as region_module
from transfer.shm.region import SharedRegion

MiB = 1 << 20


def _resident_kib(path: str) -> int:
    """Kilobytes of this process's mapping of ``path`` that have a page table entry."""
    with open("/proc/self/smaps") as smaps:
        lines = smaps.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(path):
            return next(int(entry.split()[1]) for entry in lines[i + 1:] if entry.startswith("Rss:"))
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.parametrize("commit", [True, False])
def test_a_committed_region_holds_its_memory_and_is_mapped_before_any_write(commit):
    region = SharedRegion(SharedRegion.owned_name("commit", int(commit)), 8 * MiB, create=True,
                          commit=commit)
    try:
        path = os.path.join(region_module.SHM_DIR, region.name)
        allocated = os.stat(path).st_blocks * 512
        assert allocated == (8 * MiB if commit else 0)
        assert _resident_kib(path) == (8 * MiB // 1024 if commit else 0)
    finally:
        region.close()


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A 4 MiB tmpfs standing in for /dev/shm (we are root; see the README's test command)."""
    mount = require_program("mount", "mount")
    directory = tmp_path / "shm"
    directory.mkdir()
    subprocess.run([mount, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory)], check=True)
    monkeypatch.setattr(region_module, "SHM_DIR", str(directory))
    yield directory
    subprocess.run(["umount", str(directory)], check=True)


def test_a_region_larger_than_the_free_shared_memory_fails_at_creation_when_committed(small_shm):
    with pytest.raises(SharedMemoryExhausted, match=r"too few for 8,388,608 bytes.*--segment-size"):
        SharedRegion("mooncake-te-1-big-0", 8 * MiB, create=True, commit=True)
    assert os.listdir(small_shm) == []  # nothing half-made left behind
    # Uncommitted, the same region is made (sparse) and would fail only at the first write past
    # 4 MiB, with a SIGBUS in whichever process made it: what committing turns into this error.
    lazy = SharedRegion("mooncake-te-1-big-1", 8 * MiB, create=True)
    lazy.close()


def test_a_committed_region_that_cannot_fit_is_refused_before_any_page_is_taken(small_shm, monkeypatch):
    """tmpfs gives out pages until it is full, and /dev/shm is as large as the memory: a region
    larger than the free space, or than the memory available, would take all the memory there
    is (and get a process killed) before failing. Both are refused before allocating."""
    (small_shm / "other").write_bytes(bytes(3 * MiB))  # 1 MiB of the 4 MiB tmpfs left
    allocations = []
    monkeypatch.setattr(region_module.os, "posix_fallocate", lambda *args: allocations.append(args))
    with pytest.raises(SharedMemoryExhausted, match=r"too few for 2,097,152 bytes"):
        SharedRegion("mooncake-te-1-big-2", 2 * MiB, create=True, commit=True)

    import psutil

    memory = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory._replace(available=512 * 1024))
    with pytest.raises(SharedMemoryExhausted, match=r"524,288 bytes of memory available, too few for 1,048,576"):
        SharedRegion("mooncake-te-1-big-3", MiB, create=True, commit=True)
    assert allocations == []
    assert os.listdir(small_shm) == ["other"]


def _peer_file(name: str, size: int, allocated: bool) -> str:
    """A region file as its owner leaves it, committed (every page allocated) or sparse."""
    path = os.path.join(region_module.SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if allocated:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return path


def test_an_attached_committed_region_is_mapped_before_it_is_touched_and_a_sparse_one_is_not():
    """A peer's first write into each page of an attached region would otherwise pay a page
    fault (four times the copy); populating a sparse region would take memory its owner did not."""
    committed = _peer_file(SharedRegion.owned_name("populate", 0), 8 * MiB, allocated=True)
    sparse = _peer_file(SharedRegion.owned_name("populate", 1), 8 * MiB, allocated=False)
    regions = [SharedRegion(os.path.basename(path), 8 * MiB, create=False) for path in (committed, sparse)]
    try:
        deadline = time.monotonic() + 10
        while _resident_kib(committed) < 8 * MiB // 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _resident_kib(committed) == 8 * MiB // 1024
        assert _resident_kib(sparse) == 0
        assert os.stat(sparse).st_blocks == 0
    finally:
        for region, path in zip(regions, (committed, sparse)):
            region.close()
            os.unlink(path)


def test_a_region_closed_before_the_delay_is_never_mapped_ahead():
    """A command that reads one object and exits pays nothing for the population."""
    path = _peer_file(SharedRegion.owned_name("populate", 3), 8 * MiB, allocated=True)
    try:
        region = SharedRegion(os.path.basename(path), 8 * MiB, create=False)
        assert _resident_kib(path) == 0
        region.close()
        assert not [t for t in threading.enumerate() if t.name == f"populate-{region.name}"]
    finally:
        os.unlink(path)


def test_closing_an_attached_region_stops_its_population_first(monkeypatch):
    monkeypatch.setattr(region_module, "POPULATE_DELAY", 0.0)
    path = _peer_file(SharedRegion.owned_name("populate", 2), 512 * MiB, allocated=True)
    try:
        region = SharedRegion(os.path.basename(path), 512 * MiB, create=False)
        populating = [t for t in threading.enumerate() if t.name == f"populate-{region.name}"]
        assert populating  # still at work: 512 MiB take tens of milliseconds
        region.close()
        assert not populating[0].is_alive()
        with open("/proc/self/maps") as maps:
            assert path not in maps.read()  # unmapped only once the thread had stopped
    finally:
        os.unlink(path)
