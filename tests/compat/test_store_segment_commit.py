"""An embedded store (what vLLM, SGLang and LMCache set up, one per rank) leaves its segment
uncommitted until objects land in it, as the original does; MOONCAKE_SEGMENT_PREFAULT=true asks
for the store-client daemons' commit at mount."""

from __future__ import annotations

import os

import pytest

from tests.compat.conftest import make_store

SHM = "/dev/shm"


def _own_segment_blocks() -> int:
    """Allocated bytes of this process's store segment files (the engine's buffers are separate)."""
    names = [n for n in os.listdir(SHM) if n.startswith("mooncake-") and f"-{os.getpid()}-" in n]
    assert names, "the store contributed no segment in /dev/shm"
    return sum(os.stat(os.path.join(SHM, n)).st_blocks * 512 for n in names)


@pytest.mark.parametrize("prefault, committed", [(None, False), ("true", True)])
def test_an_embedded_store_commits_its_segment_only_when_asked(master, monkeypatch, prefault, committed):
    if prefault is not None:
        monkeypatch.setenv("MOONCAKE_SEGMENT_PREFAULT", prefault)
    else:
        monkeypatch.delenv("MOONCAKE_SEGMENT_PREFAULT", raising=False)
    store = make_store(master, segment="16MB")
    try:
        blocks = _own_segment_blocks()
        assert (blocks >= 16 << 20) if committed else (blocks < 16 << 20)
    finally:
        store.close()
