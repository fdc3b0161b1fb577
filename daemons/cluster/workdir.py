"""Where a cluster keeps its state on disk, and the small JSON records daemons and `up` share.

    <workdir>/cluster.json          the cluster as `up` started it (id, daemons, addresses)
    <workdir>/settings.yaml         the effective settings `up` resolved; every daemon loads it
    <workdir>/topology.json         the topology matrix `up` discovered (or loaded); engines use it
    <workdir>/run/<name>.pid        pid and process start time, written at spawn
    <workdir>/run/<name>.json       what the daemon bound (address), written once it serves
    <workdir>/run/<name>.sock       the daemon's Unix stream socket (unix://), for clients on this host
    <workdir>/run/<name>.exit       why the daemon stopped, when it could say so
    <workdir>/logs/<name>.log       the daemon's stdout and stderr
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def announce_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def ipc_socket(self, name: str) -> Path:
        return self.run_dir / f"{name}.sock"

    def exit_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.exit"

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

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
