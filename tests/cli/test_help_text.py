"""Help text reads as prose: a docstring's source line breaks do not survive into `--help`."""

from __future__ import annotations

import subprocess
import sys

from typer.core import TyperCommand


def test_every_paragraph_of_a_help_is_one_line_unless_it_is_a_list():
    from mooncake_cli.app import COMMANDS, commands_of

    def walk(command):
        yield command
        for sub in getattr(command, "commands", {}).values():
            yield from walk(sub)

    modules = {entry.module for entry in COMMANDS.values()}
    checked = 0
    for module in sorted(modules):
        for top in commands_of(module).values():
            for command in walk(top):
                for paragraph in (command.help or "").split("\n\n"):
                    lines = paragraph.split("\n")
                    listed = any(line.startswith((" ", "-", "*", "|")) for line in lines)
                    assert len(lines) == 1 or listed or paragraph.startswith("\b"), (command.name, paragraph)
                    checked += 1
    assert checked > 50


def test_a_list_paragraph_keeps_its_lines():
    from mooncake_cli.app import _reflow_help

    command = TyperCommand("x", help="First line\nstill first.\n\nProse that\nwraps.\n\n- one\n- two")
    _reflow_help(command)
    assert command.help == "First line still first.\n\nProse that wraps.\n\n- one\n- two"


def test_bench_store_help_joins_its_source_lines():
    out = subprocess.run([sys.executable, "-m", "mooncake_cli", "bench", "store", "--help"], capture_output=True,
                         text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert "another process on this host (shared memory), or with --master" in out
