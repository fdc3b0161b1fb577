"""The `mooncake` command: a typer app whose subcommands live one per file in commands/.

Shell scripts call `mooncake exists KEY` or `mooncake get KEY` in loops, so a call builds only
the command it runs: the root group finds the module that registers a command in COMMANDS and
imports it on first use, and `mooncake --help` lists each command with the one-line help that
COMMANDS holds for it, importing no command module. Each module, in turn, imports the library
behind a command inside that command.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

from mooncake_cli.coercion import context_of, defer_coercion


class Entry(NamedTuple):
    module: str  # the module of commands/ whose `register(root)` registers the command
    summary: str  # the first paragraph of the command's help, as `mooncake --help` lists it


# Every command, in the order `mooncake --help` lists them. A summary is its command's own
# (tests/cli/test_startup.py checks each against the command's help), kept here so that listing
# the commands builds none of them.
COMMANDS = {
    "up": Entry("cluster", "Start every daemon of a single-host cluster in the background and wait until all are healthy."),
    "status": Entry("cluster", "Show each daemon's role, pid, address, metrics URL, uptime and health."),
    "restart": Entry("cluster", "Restart one daemon of the running cluster: stop it (SIGTERM, SIGKILL after --stop-grace) "
                                "if it runs, then start it again on its old control port, in the same cluster."),
    "down": Entry("cluster", "Stop the cluster: SIGTERM, then SIGKILL after --stop-grace; remove pidfiles and shared memory."),
    "sim": Entry("sim", "Replay TRACE through the conductor (Algorithm 1, hot-block replication, early rejection)."),
    "put": Entry("store", "Store FILE (or stdin) under KEY."),
    "get": Entry("store", "Write the object's bytes to stdout (binary-safe) or to -o FILE."),
    "rm": Entry("store", "Remove an object."),
    "exists": Entry("store", "Exit 0 if a complete object KEY exists, 1 if not."),
    "inspect": Entry("inspect", "Show the store as the master sees it."),
    "tenant": Entry("tenant", "The store's tenants: usage, quotas, and changing a quota at run time."),
    "drain": Entry("drain", "Move every object held only on SEGMENT to other segments, then unmount SEGMENT."),
    "generate": Entry("generate", "Generate a greedy completion of PROMPT through the conductor and its P/D workers."),
    "config": Entry("config", "Inspect the effective settings."),
    "topo": Entry("topo", "Discover and explain this host's topology matrix (NUMA, PCIe, NICs, GPUs)."),
    "start": Entry("start", "Start one daemon in the foreground or as a background process."),
    "bench": Entry("bench", "Measure speed against this machine's own limits."),
}


def commands_of(module: str) -> dict[str, TyperCommand | TyperGroup]:
    """The commands that ``mooncake_cli.commands.<module>`` registers, built as click commands."""
    holder = typer.Typer()
    importlib.import_module(f"mooncake_cli.commands.{module}").register(holder)
    commands = dict(typer.main.get_group(holder).commands)
    for command in commands.values():
        _reflow_help(command)
    return commands


def _reflow_help(command: TyperCommand | TyperGroup) -> None:
    """Join the source line breaks inside each paragraph of a command's help (and its
    subcommands'): typer joins them in the first paragraph only, so the rest came out as
    source lines cut again by the terminal's width. A paragraph that is a list, or indented,
    keeps its lines."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(p if _keeps_lines(p) else " ".join(p.split("\n")) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        _reflow_help(sub)


def _keeps_lines(paragraph: str) -> bool:
    return paragraph.startswith("\b") or any(line.startswith((" ", "-", "*", "|")) for line in paragraph.split("\n"))


class LazyCommands(Mapping):
    """COMMANDS' names, each built on first lookup together with the rest of its module's."""

    def __init__(self) -> None:
        self._built: dict[str, TyperCommand | TyperGroup] = {}

    def __getitem__(self, name: str) -> TyperCommand | TyperGroup:
        if name not in self._built:
            self._built.update(commands_of(COMMANDS[name].module))  # KeyError for an unknown name
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyGroup(TyperGroup):
    """The root group, holding LazyCommands in place of the commands registered with the app
    (typer builds a group from those, and has no lazy kind)."""

    def __init__(self, **attrs) -> None:
        super().__init__(**{**attrs, "commands": LazyCommands()})

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)  # typer's walks the commands' values, which would build them all

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, TyperCommand | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:  # about to run: see mooncake_cli.coercion
            defer_coercion(command, context_of(command, name, ctx))
        return name, command, rest

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        defer_coercion(self, ctx, subcommands=False)  # built when resolved, above
        return super().parse_args(ctx, args)

    def format_help(self, ctx: typer.Context, formatter) -> None:
        """Typer's help of this group, its commands listed from COMMANDS' summaries: a listing
        needs only a command's name and first paragraph, not the command built."""
        listing = copy.copy(self)
        listing.commands = {name: TyperCommand(name, help=entry.summary) for name, entry in COMMANDS.items()}
        TyperGroup.format_help(listing, ctx, formatter)


app = typer.Typer(
    name="mooncake",
    cls=LazyGroup,
    help="Mooncake: KVCache-centric disaggregated LLM serving (transfer engine, KVCache store, "
    "conductor, prefill/decode workers). Exit codes: 0 ok, 1 operation failed, 2 usage error.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _before_any_command() -> None:
    """Nothing to do: typer builds a group only for an app with a callback or commands, and
    this app's commands are not registered with it but looked up by LazyGroup."""


def main() -> None:
    from mooncake_cli.output import fail_on
    from transfer.errors import MooncakeError

    # Commands are quiet by default: library chatter (such as "RDMA unavailable, using TCP" on a
    # host without RDMA) is for the daemons' logs; a command reports through its result or error.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if sys.argv[1:2] == ["put"]:  # the one command whose arguments are rewritten; the others skip its module
        from mooncake_cli.commands.store import expand_soft_pin_value

        sys.argv[1:] = expand_soft_pin_value(sys.argv[1:])
    try:
        app()
    except MooncakeError as exc:  # anything a command did not render itself
        try:
            fail_on(exc)
        except typer.Exit as exit_:
            raise SystemExit(exit_.exit_code) from None
