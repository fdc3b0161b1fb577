"""Shared fixtures: engines that always close, and a check that no test leaks /dev/shm regions."""

from __future__ import annotations

import os
import subprocess
import sys
import json

import psutil
import pytest

from transfer.engine import TransferEngine
from transfer.engine_options import EngineOptions
from transfer.shm.region import PREFIX, SHM_DIR

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def _regions() -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)}


def _foreign(region: str) -> bool:
    """Owned by a live process outside this test run's tree: another suite or a running cluster
    on the same machine, whose regions come and go while this test runs."""
    owner = int(region[len(PREFIX):].split("-", 1)[0])
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    return owner not in ours and psutil.pid_exists(owner)


@pytest.fixture(autouse=True)
def no_leaked_regions():
    before = _regions()
    yield
    leaked = {region for region in _regions() - before if not _foreign(region)}
    assert not leaked, f"test left shared-memory regions behind: {sorted(leaked)}"


@pytest.fixture
def make_engine():
    """Build engines with option overrides; every one is closed after the test."""
    engines: list[TransferEngine] = []

    def make(**overrides) -> TransferEngine:
        metadata = overrides.pop("metadata", "P2PHANDSHAKE")
        name = overrides.pop("name", None)
        options = EngineOptions(**{"transfer_timeout": 10.0, **overrides})
        engine = TransferEngine(name, metadata=metadata, options=options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


class TargetProcess:
    """An engine in another process, serving one shared-memory buffer; killed at teardown."""

    def __init__(self, size: int, protocol: str = "tcp") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "target_main.py"), str(size), protocol],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise RuntimeError("target process did not start")
        info = json.loads(line)
        self.name, self.address, self.pid = info["name"], info["address"], self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()
        # A killed target cannot unlink its regions; the sweep every engine runs at start does.
        from transfer.shm.region import remove_orphans
        remove_orphans()


@pytest.fixture
def target_process():
    started: list[TargetProcess] = []

    def start(size: int, protocol: str = "tcp") -> TargetProcess:
        target = TargetProcess(size, protocol)
        started.append(target)
        return target

    yield start
    for target in started:
        target.stop()
