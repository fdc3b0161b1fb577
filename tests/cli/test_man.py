"""The man pages are generated from the CLI and the settings registry and must be current."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "man"))

import generate  # noqa: E402
from tests.conftest import require_program  # noqa: E402


def test_every_command_has_a_current_page():
    result = subprocess.run([sys.executable, str(REPO / "man" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"run `python man/generate.py`:\n{result.stdout}"


def test_a_removed_page_is_reported_missing(tmp_path, monkeypatch):
    for page in (REPO / "man").glob("*.1"):
        shutil.copy(page, tmp_path / page.name)
    (tmp_path / "mooncake-up.1").unlink()
    (tmp_path / "mooncake-down.1").write_text("stale\n")
    monkeypatch.setattr(generate, "MAN_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", ["generate.py", "--check"])
    assert generate.main() == 1


def test_pages_list_flags_and_environment_from_the_registry():
    page = generate.pages()["mooncake-up.1"]
    assert "\\-\\-stop\\-grace" in page and "MOONCAKE_STOP_GRACE" in page
    top = generate.pages()["mooncake.1"]
    assert "MOONCAKE_RPC_TIMEOUT" in top and "mooncake\\-up" in top


def test_man_renders_the_top_page():
    require_program("man", "man-db")
    result = subprocess.run(["man", "-l", str(REPO / "man" / "mooncake.1")], capture_output=True,
                            text=True, env={"MANPAGER": "cat", "PATH": "/usr/bin:/bin", "COLUMNS": "100"})
    assert result.returncode == 0 and "Mooncake" in result.stdout
