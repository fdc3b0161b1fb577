"""mooncake_cli.coercion against typer's own conversion of the same parameters.

Every parameter of every command, its value converted by a DeferredCoercion, gets what typer
would give it, or the error typer would raise; and typer still reads a parameter's conversion
from where the deferral puts it. These fail when typer changes what the deferral relies on (see
that module's docstring); that `mooncake` then parses without importing pydantic is checked by
tests/cli/test_startup.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from mooncake_cli.app import COMMANDS, app, commands_of
from mooncake_cli.coercion import DeferredCoercion, context_of, defer_coercion

# What a command line or a default hands a parameter: nothing, text of every shape our
# parameters parse (numbers in and out of range, paths, a dash), and the values of flags.
VALUES = (None, "", "text", "-", "12", "0", "-3", "1.5", "1e3", "x1", "/tmp/some file", True, False, 7)


def _params(command: Any, ctx: typer.Context) -> Iterator[tuple[str, Any, typer.Context]]:
    for param in command.params:
        yield f"{ctx.command_path} {param.name}", param, ctx
    for name, sub in getattr(command, "commands", {}).items():
        yield from _params(sub, context_of(sub, name, ctx))


def _each_parameter_twice() -> Iterator[tuple[str, Any, typer.Context, Any, typer.Context]]:
    """Every parameter of every command, as typer builds it and as `mooncake` runs it."""
    root = typer.Context(typer.main.get_command(app), info_name="mooncake")
    for module in sorted({entry.module for entry in COMMANDS.values()}):
        typers, deferred = commands_of(module), commands_of(module)
        for name in typers:
            plain_ctx = context_of(typers[name], name, root)
            deferred_ctx = context_of(deferred[name], name, root)
            defer_coercion(deferred[name], deferred_ctx)
            plain = list(_params(typers[name], plain_ctx))
            ours = list(_params(deferred[name], deferred_ctx))
            assert [p[0] for p in plain] == [p[0] for p in ours]
            for (path, param, ctx), (_, our_param, our_ctx) in zip(plain, ours, strict=True):
                yield path, param, ctx, our_param, our_ctx


def _processed(param: Any, ctx: typer.Context, value: Any) -> Any:
    try:
        return "value", param.process_value(ctx, value)
    except typer.BadParameter as exc:  # MissingParameter among them
        return "error", type(exc).__name__, exc.format_message()


def test_every_parameter_gets_what_typer_gives_it_or_typers_error():
    checked = 0
    for path, param, ctx, our_param, our_ctx in _each_parameter_twice():
        for value in VALUES:
            assert _processed(our_param, our_ctx, value) == _processed(param, ctx, value), (path, value)
            checked += 1
    assert checked > 1000  # every command's parameters, not some


def test_typer_converts_through_the_deferred_coercion():
    """The hook itself: typer takes a parameter's conversion from ``_runtime_param`` when set."""
    for path, _, _, param, ctx in _each_parameter_twice():
        assert isinstance(param.get_runtime_param(), DeferredCoercion), path
        assert isinstance(type(ctx.command).get_help_option(ctx.command, ctx).get_runtime_param(),
                          DeferredCoercion), path


def test_a_value_typer_must_convert_is_converted_by_typer():
    command = commands_of("store")["put"]
    ctx = typer.Context(command, info_name="put")
    defer_coercion(command, ctx)
    replicas = next(p for p in command.params if p.name == "replicas")
    assert replicas.process_value(ctx, "3") == 3
    with pytest.raises(typer.BadParameter, match="greater than or equal to 1"):
        replicas.process_value(ctx, "0")
    plot = next(p for p in commands_of("sim")["sim"].params if p.name == "plot")
    assert DeferredCoercion(takes_text=False).coerce("out.png", plot, ctx) == Path("out.png")


def test_text_for_a_parser_goes_to_the_parser():
    holder = typer.Typer()

    @holder.command()
    def shout(word: str = typer.Option("", parser=str.upper)) -> None:
        """A parameter of text that typer converts: none of ours has a parser yet."""

    command = typer.main.get_command(holder)
    ctx = typer.Context(command, info_name="shout")
    defer_coercion(command, ctx)
    assert command.params[0].process_value(ctx, "quiet") == "QUIET"
