"""Shared test helpers: run the real `mooncake` command in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist's workers run with COLUMNS=80 set, and the CLI, as rich does, takes COLUMNS as the
# terminal's width: every `mooncake` a test runs would print as if to an 80-column terminal, not
# as a script that pipes it sees it.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


def require_program(program: str, package: str) -> str:
    """The path of an external program a test needs; if it is missing, the test fails with one
    line naming the Debian package (the README's test command installs them all), so a machine
    set up short of the README never passes by running less."""
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed: apt-get install {package} "
                    "(the README's test command installs it)", pytrace=False)
    return path


def require_cuda() -> None:
    """Skip the calling test, saying why, where torch sees no CUDA device (every machine of this
    repository's CI: the tests marked gpu run with tests/gpu/run_on_gpu.sh on a host with one)."""
    import torch  # here: most test sessions never ask

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")


class Mooncake:
    """Runs `python -m mooncake_cli ...` against one workdir, like an ops script would."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
        self.env["MOONCAKE_WORKDIR"] = str(workdir)
        # Clusters serve no model unless a test asks (env=...): a torch worker takes seconds to start.
        self.env.update({"MOONCAKE_PREFILL_WORKERS": "0", "MOONCAKE_DECODE_WORKERS": "0"})
        # No metrics servers unless a test asks (tests/daemons/observe): a master started on its own
        # binds 9003, which another test's master or any other process on the machine may hold.
        self.env["MOONCAKE_METRICS_PORT"] = "0"
        # Segments fill lazily unless a test asks: committing 1 GiB at mount (segment_prefault, on
        # in the product) adds ~0.9 s to every `up`, ~100 of them in the suite;
        # tests/transfer/test_shm_region.py and tests/store/test_store_segment_prefault.py cover it.
        self.env["MOONCAKE_SEGMENT_PREFAULT"] = "false"

    def __call__(self, *args: str, timeout: float = 60, env: dict | None = None,
                 input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], cwd=REPO,
                              env={**self.env, **(env or {})}, capture_output=True,
                              timeout=timeout, input=input)

    @property
    def secret(self):
        """The secret `up` made for this cluster, for a test's own clients of its daemons."""
        from transfer.auth import read_secret_file

        return read_secret_file(self.workdir / "secret")

    def json(self, *args: str, **kwargs) -> dict:
        result = self(*args, "--json", **kwargs)
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)


@pytest.fixture
def mooncake(tmp_path):
    runner = Mooncake(tmp_path / "cluster")
    yield runner
    runner("down", timeout=60)
