"""A fresh machine installs exactly the lock files: every import must be declared, and every
declared requirement pinned there, or a new user's first command fails where ours did not."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pins(lock: str) -> dict[str, Version]:
    """name -> version of each `name==version` line of a pip-compile'd lock."""
    pinned = {}
    for line in (REPO / lock).read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            name, _, version = requirement.partition("==")
            assert version, f"{lock}: {line!r} is not an exact pin"
            pinned[canonicalize_name(name)] = Version(version)
    return pinned


def test_every_import_is_declared():
    result = subprocess.run([sys.executable, "-m", "deptry", "."], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("lock, extras", [("requirements.lock", []),
                                          ("requirements-test.lock", ["test"])])
def test_the_lock_pins_every_declared_requirement(lock, extras):
    declared = [Requirement(r) for r in PYPROJECT["dependencies"]]
    declared += [Requirement(r) for extra in extras for r in PYPROJECT["optional-dependencies"][extra]]
    pinned = pins(lock)
    unpinned = [str(r) for r in declared if canonicalize_name(r.name) not in pinned]
    assert not unpinned, f"{lock} lacks {unpinned}: run `bash .ci/lock`"
    stale = [f"{r} (locked {pinned[canonicalize_name(r.name)]})" for r in declared
             if not r.specifier.contains(pinned[canonicalize_name(r.name)], prereleases=True)]
    assert not stale, f"{lock} pins versions pyproject.toml no longer allows: {stale}; run `bash .ci/lock`"


def test_the_lock_holds_torch_to_its_cpu_build():
    # A CUDA build would pull several GB of nvidia-* wheels into every fresh install.
    pinned = pins("requirements-test.lock")
    assert pinned["torch"].local == "cpu"
    assert not [name for name in pinned if name.startswith("nvidia-")]
