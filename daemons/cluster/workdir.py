"""Where a cluster keeps its state on disk, and the small JSON records daemons and `up` share.

    <workdir>/cluster.json          the cluster as `up` started it (id, daemons, addresses)
    <workdir>/settings.yaml         the effective settings `up` resolved; every daemon loads it
    <workdir>/topology.json         the topology matrix `up` discovered (or loaded); engines use it
    <workdir>/<name>-settings.yaml  the settings `mooncake start` resolved for that one daemon
    <workdir>/run/<name>.pid        pid and process start time, written at spawn
    <workdir>/run/<name>.json       what the daemon bound (address), written once it serves
    <workdir>/run/<name>.sock       the daemon's Unix stream socket (unix://), for clients on this host
    <workdir>/run/<name>.exit       why the daemon stopped, when it could say so
    <workdir>/logs/<name>.log       the daemon's stdout and stderr
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transfer.errors import InvalidArgument

# A daemon's name becomes file names under run/ and logs/, a socket path and a client id: one path
# component of plain characters, so no name can reach outside the workdir ("../x", "a/b").
DAEMON_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def checked_name(name: str) -> str:
    """``name`` if it can name a daemon, else InvalidArgument saying what a name may hold."""
    if not DAEMON_NAME.fullmatch(name) or ".." in name:
        raise InvalidArgument(f"daemon name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit, without '..'")
    return name


@dataclass(frozen=True)
class ClusterPaths:
    workdir: Path

    @classmethod
    def of(cls, workdir: str | os.PathLike) -> ClusterPaths:
        return cls(Path(workdir).expanduser().resolve())

    @property
    def cluster_file(self) -> Path:
        return self.workdir / "cluster.json"

    @property
    def settings_file(self) -> Path:
        return self.workdir / "settings.yaml"

    @property
    def topology_file(self) -> Path:
        return self.workdir / "topology.json"

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def profile_lock(self) -> Path:
        """Held by a worker while it runs its start-up profile: one at a time per workdir."""
        return self.run_dir / "profile.lock"

    def daemon_settings_file(self, name: str) -> Path:
        return self.workdir / f"{checked_name(name)}-settings.yaml"

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{checked_name(name)}.pid"

    def announce_file(self, name: str) -> Path:
        return self.run_dir / f"{checked_name(name)}.json"

    def ipc_socket(self, name: str) -> Path:
        return self.run_dir / f"{checked_name(name)}.sock"

    def exit_file(self, name: str) -> Path:
        return self.run_dir / f"{checked_name(name)}.exit"

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{checked_name(name)}.log"

    def known_daemons(self) -> list[str]:
        """Names with a pidfile, in the order they were started."""
        if not self.run_dir.is_dir():
            return []
        pidfiles = sorted(self.run_dir.glob("*.pid"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        return [p.stem for p in pidfiles]


def shm_prefix(cluster_id: str) -> str:
    """Every shared-memory region of a cluster starts with this, so `down` can find leftovers."""
    return f"mooncake-{cluster_id}-"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
