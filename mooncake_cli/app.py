"""The `mooncake` command: a typer app whose subcommands live one per file in commands/.

Shell scripts call `mooncake exists KEY` or `mooncake get KEY` in loops, so a call builds only
the command it runs: the root group finds the module that registers a command in COMMANDS and
imports it on first use (`mooncake --help` imports them all, to list each one-line help). Each
module, in turn, imports the library behind a command inside that command.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator, Mapping

import typer
from typer.core import TyperCommand, TyperGroup

from mooncake_cli.coercion import context_of, defer_coercion

# Which module of commands/ registers each command (with its `register(root)`), in the order
# `mooncake --help` lists them.
COMMANDS = {
    "up": "cluster", "status": "cluster", "restart": "cluster", "down": "cluster", "sim": "sim",
    "put": "store", "get": "store", "rm": "store", "exists": "store", "inspect": "inspect", "tenant": "tenant",
    "drain": "drain",
    "generate": "generate", "config": "config", "topo": "topo", "start": "start", "bench": "bench",
}


def commands_of(module: str) -> dict[str, TyperCommand | TyperGroup]:
    """The commands that ``mooncake_cli.commands.<module>`` registers, built as click commands."""
    holder = typer.Typer()
    importlib.import_module(f"mooncake_cli.commands.{module}").register(holder)
    return dict(typer.main.get_group(holder).commands)


class LazyCommands(Mapping):
    """COMMANDS' names, each built on first lookup together with the rest of its module's."""

    def __init__(self) -> None:
        self._built: dict[str, TyperCommand | TyperGroup] = {}

    def __getitem__(self, name: str) -> TyperCommand | TyperGroup:
        if name not in self._built:
            self._built.update(commands_of(COMMANDS[name]))  # KeyError for an unknown name
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

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, TyperCommand | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:  # about to run: see mooncake_cli.coercion
            defer_coercion(command, context_of(command, name, ctx))
        return name, command, rest

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        defer_coercion(self, ctx, subcommands=False)  # built when resolved, above
        return super().parse_args(ctx, args)


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
    from mooncake_cli.commands.store import expand_soft_pin_value
    from mooncake_cli.output import fail_on
    from transfer.errors import MooncakeError

    # Commands are quiet by default: library chatter (such as "RDMA unavailable, using TCP" on a
    # host without RDMA) is for the daemons' logs; a command reports through its result or error.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    sys.argv[1:] = expand_soft_pin_value(sys.argv[1:])
    try:
        app()
    except MooncakeError as exc:  # anything a command did not render itself
        try:
            fail_on(exc)
        except typer.Exit as exit_:
            raise SystemExit(exit_.exit_code) from None
