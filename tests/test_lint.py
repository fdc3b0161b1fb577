"""The rooms' import directions (import-linter's contracts in pyproject.toml) and ruff's checks
hold for the whole tree: CI runs only pytest, so these run them, and a failure shows their report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (the virtualenv's), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name) or name


def test_imports_follow_the_room_contracts():
    result = subprocess.run([_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
