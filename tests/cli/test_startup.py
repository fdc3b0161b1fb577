"""What a `mooncake` call imports before, and while, its command runs.

Shell scripts call `mooncake exists` and `mooncake get` in loops, and the suite's own daemons
start as `python -m mooncake_cli start ROLE --foreground`: the root group imports only the
module of the command that runs (`mooncake --help` none: it lists the summaries the command
table holds), a command module imports the library behind it inside the command, parsing
imports no pydantic (mooncake_cli.coercion), and a small object's put or get moves through no
numpy. These fail when a heavy import comes back to a module's top level.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from mooncake_cli.app import COMMANDS, commands_of
from tests.conftest import REPO, Mooncake

# What the commands use, none of which parsing needs: the daemons and the libraries they stand on.
BEHIND_THE_COMMANDS = (
    "torch", "numpy", "etcd3gw", "requests", "zmq", "msgpack", "psutil", "yaml", "pydantic",
    "daemons.supervisor", "daemons.launcher", "daemons.roles", "daemons.master", "daemons.store_client",
    "daemons.serving.client", "store.client", "store.master_client", "scheduler.conductor", "scheduler.sim.engine",
    "transfer.engine", "transfer.rpc.client_server", "transfer.etcd.kv", "topology",
)
# What only a daemon's own process needs: `mooncake status` and `down` import the supervisor.
DAEMON_CODE = ("torch", "numpy", "etcd3gw", "requests", "daemons.master", "daemons.store_client", "store.client")
# What no put, get or exists of a small object needs: the models' and etcd's libraries, numpy
# (large copies only), pydantic (typer's conversion of values: mooncake_cli.coercion), and the
# daemons.
NOT_FOR_A_SMALL_OBJECT = ("torch", "numpy", "etcd3gw", "requests", "yaml", "pydantic", "daemons.supervisor",
                          "daemons.launcher", "daemons.master", "daemons.store_client")


def _imported(statement: str, candidates: tuple[str, ...]) -> list[str]:
    """Those of ``candidates`` that a fresh interpreter holds after ``statement``."""
    code = f"import json, sys; {statement}; print(json.dumps(sorted(m for m in {candidates!r} if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_building_the_cli_imports_nothing_behind_the_commands():
    assert _imported("import mooncake_cli.app", BEHIND_THE_COMMANDS) == []


def test_building_the_cli_imports_no_command_module():
    statement = "import mooncake_cli.app; print([m for m in sys.modules if m.startswith('mooncake_cli.commands.')], file=sys.stderr)"
    result = subprocess.run([sys.executable, "-c", f"import sys; {statement}"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "[]", result.stderr


def test_the_supervisor_imports_no_daemon_code():
    assert _imported("import daemons.supervisor", DAEMON_CODE) == []


def test_etcd3gw_is_imported_only_for_an_etcd_client():
    assert _imported("import transfer.etcd.kv", ("etcd3gw", "requests")) == []


def test_the_command_table_names_every_command_each_module_registers():
    modules = {entry.module for entry in COMMANDS.values()}
    registered = {name: module for module in modules for name in commands_of(module)}
    assert registered == {name: entry.module for name, entry in COMMANDS.items()}


def test_the_command_table_holds_each_commands_own_summary():
    """The first paragraph of its help, which typer's listing of a group shows of a command."""
    for name, entry in COMMANDS.items():
        command = commands_of(entry.module)[name]
        assert entry.summary == inspect.cleandoc(command.help).split("\n\n")[0], name
        assert (command.short_help, command.hidden, command.deprecated) == (None, False, False), name


def _help(statement: str) -> str:
    env = {**os.environ, "COLUMNS": "250"}
    result = subprocess.run([sys.executable, "-c", statement], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_help_is_typers_help_of_the_group_with_every_command_built():
    built = ("import typer\nfrom typer.core import TyperGroup\nfrom mooncake_cli.app import app\n"
             "root = typer.main.get_command(app)\n"
             "root.commands = {name: root.commands[name] for name in root.list_commands(None)}\n"
             "TyperGroup.format_help(root, typer.Context(root, info_name='mooncake'), None)\n"
             "print()\n")  # --help then echoes click's help text, empty: typer printed it already
    lazy = "import sys\nsys.argv = ['mooncake', '--help']\nfrom mooncake_cli.app import main\nmain()\n"
    assert _help(lazy) == _help(built)


def test_help_lists_every_command_with_its_one_line_help():
    env = {**os.environ, "COLUMNS": "250"}
    result = subprocess.run([sys.executable, "-m", "mooncake_cli", "--help"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = [re.sub(r"\s+", " ", line.strip("│ ")) for line in result.stdout.splitlines()]
    listed = [row.split(" ", 1)[0] for row in rows if row.split(" ", 1)[0] in COMMANDS]
    assert listed == list(COMMANDS)  # every one, in the table's order
    for name, entry in COMMANDS.items():
        summary = commands_of(entry.module)[name].help.strip().splitlines()[0]
        assert any(row.startswith(f"{name} ") and summary in row for row in rows), (name, summary)


def test_help_builds_no_command_and_imports_nothing_behind_them():
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules))))\n"
            "sys.argv = ['mooncake', '--help']\nfrom mooncake_cli.app import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Usage: mooncake" in result.stdout, result.stderr
    modules = set(json.loads(result.stderr.rpartition("\nMODULES ")[2]))
    assert sorted(m for m in modules if m.startswith("mooncake_cli.commands.")) == []
    assert sorted(modules & {*BEHIND_THE_COMMANDS, "pydantic"}) == []


def test_an_unknown_command_is_a_usage_error_that_suggests_the_near_one():
    result = subprocess.run([sys.executable, "-m", "mooncake_cli", "exist", "k"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "Did you mean 'exists'?" in result.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("startup") / "cluster")
    up = runner("up")
    assert up.returncode == 0, up.stderr.decode()
    yield runner
    runner("down")


def _run_and_list_modules(mooncake: Mooncake, *args: str, input: bytes | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``mooncake ARGS`` in a fresh interpreter, and every module it held when it exited."""
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules))))\n"
            "sys.argv = ['mooncake', *sys.argv[1:]]\n"
            "from mooncake_cli.app import main\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=mooncake.env, input=input,
                            capture_output=True, timeout=60)
    modules = json.loads(result.stderr.decode().rpartition("\nMODULES ")[2])
    return result, set(modules)


def test_a_small_objects_put_get_and_exists_import_no_numpy_torch_or_etcd(cluster):
    blob = os.urandom(4096)
    put, put_modules = _run_and_list_modules(cluster, "put", "small", "-", input=blob)
    assert put.returncode == 0, put.stderr.decode()
    got, get_modules = _run_and_list_modules(cluster, "get", "small")
    assert got.returncode == 0 and got.stdout == blob
    into = cluster.workdir / "small.out"
    written, written_modules = _run_and_list_modules(cluster, "get", "small", "-o", str(into))
    assert written.returncode == 0 and into.read_bytes() == blob
    found, exists_modules = _run_and_list_modules(cluster, "exists", "small")
    assert found.returncode == 0

    assert "transfer.engine" in get_modules and "store.client" in put_modules  # they moved the bytes
    for modules in (put_modules, get_modules, written_modules, exists_modules):
        assert sorted(modules & set(NOT_FOR_A_SMALL_OBJECT)) == []
    # exists asks the master alone (no store client, no transfer engine, no CURVE server, whose
    # authenticator brings asyncio) and, found, prints nothing.
    assert sorted(exists_modules & {"store.client", "transfer.engine", "topology", "psutil", "rich", "asyncio"}) == []


def test_a_large_put_still_copies_through_numpy(cluster):
    blob = os.urandom(256 * 1024)
    put, modules = _run_and_list_modules(cluster, "put", "large", "-", input=blob)
    assert put.returncode == 0, put.stderr.decode()
    assert "numpy" in modules
    assert cluster("get", "large").stdout == blob

