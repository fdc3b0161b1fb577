"""What a `mooncake` call imports before its command runs.

Every call builds the whole command tree to parse its arguments (the suite's own daemons start
as `python -m mooncake_cli start ROLE --foreground`), so a command module imports the library
behind it inside the command. These fail when a heavy import comes back to a module's top level.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

# What the commands use, none of which parsing needs: the daemons and the libraries they stand on.
BEHIND_THE_COMMANDS = (
    "torch", "numpy", "etcd3gw", "requests", "zmq", "msgpack", "psutil",
    "daemons.supervisor", "daemons.launcher", "daemons.roles", "daemons.master", "daemons.store_client",
    "daemons.serving.client", "store.client", "store.master_client", "scheduler.conductor", "scheduler.sim.engine",
    "transfer.engine", "transfer.rpc.client_server", "transfer.etcd.kv", "topology",
)
# What only a daemon's own process needs: `mooncake status` and `down` import the supervisor.
DAEMON_CODE = ("torch", "numpy", "etcd3gw", "requests", "daemons.master", "daemons.store_client", "store.client")


def _imported(statement: str, candidates: tuple[str, ...]) -> list[str]:
    """Those of ``candidates`` that a fresh interpreter holds after ``statement``."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(m for m in {candidates!r} if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_building_the_cli_imports_nothing_behind_the_commands():
    assert _imported("import mooncake_cli.app", BEHIND_THE_COMMANDS) == []


def test_the_supervisor_imports_no_daemon_code():
    assert _imported("import daemons.supervisor", DAEMON_CODE) == []


def test_etcd3gw_is_imported_only_for_an_etcd_client():
    assert _imported("import transfer.etcd.kv", ("etcd3gw", "requests")) == []
