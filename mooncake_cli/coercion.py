"""Parameter values without pydantic, where typer would hand them back unchanged anyway.

Typer converts every parameter's value, given or not, through a pydantic TypeAdapter that it
builds on first use for that parameter; the first one imports pydantic, which costs about as much
again as importing typer itself (and `mooncake exists` took 0.24 s where it now takes 0.14 s on
this 2-core machine, in one run alternating the two). Almost every value our commands take is
either absent (None: the dozens of setting flags a call does not give) or text (setting flags are
parsed by the settings registry, not by typer), and for those typer's conversion is the
identity. So each parameter gets a :class:`DeferredCoercion`, which returns those as typer would
and hands any other value (an int, a float, a path, text for a parameter of another type or with
a parser) to typer's own conversion, built then, so its checks and error messages stay typer's.

Typer has no public hook for a parameter's conversion: this relies on ``_TyperParameter``
reading its conversion from ``_runtime_param`` when set and calling its ``coerce(value, param=,
ctx=)``, and on ``typer._coercion.build_runtime_param``; tests/cli/test_coercion.py fails when
typer changes either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typer.core import TyperArgument, TyperOption

if TYPE_CHECKING:
    import typer
    from typer._coercion import RuntimeParam


class DeferredCoercion:
    """One single-valued parameter's conversion: None and text as typer's, anything else by typer's."""

    def __init__(self, takes_text: bool) -> None:
        self._takes_text = takes_text
        self._typers: RuntimeParam | None = None

    def coerce(self, value: Any, param: TyperOption | TyperArgument, ctx: typer.Context) -> Any:
        if value is None:  # typer's answer for a value not given, without its adapter
            return None
        if self._takes_text and type(value) is str:
            return value  # typer's str conversion returns text as it came
        if self._typers is None:
            from typer._coercion import build_runtime_param

            self._typers = build_runtime_param(param.type_descriptor)
        return self._typers.coerce(value, param=param, ctx=ctx)


def defer_coercion(command: Any, ctx: typer.Context, *, subcommands: bool = True) -> None:
    """Give each typer parameter of ``command`` a DeferredCoercion: its own, its help option
    (which click makes on first use, here as it would in ``ctx``, the context ``command`` runs
    in) and, with ``subcommands``, those of every subcommand, built already as typer builds a
    group's commands with it."""
    for param in (*command.params, command.get_help_option(ctx)):
        # A parameter taking many values (none of ours yet) keeps typer's: it turns None into ().
        takes_one = isinstance(param, (TyperOption, TyperArgument)) and not (param.multiple or param.nargs == -1)
        if takes_one and param._runtime_param is None:
            described = param.type_descriptor  # text for a parser= goes to the parser
            param._runtime_param = DeferredCoercion(
                takes_text=described.annotation is str and described.parameter_info.parser is None)
    if subcommands:
        for name, sub in getattr(command, "commands", {}).items():
            defer_coercion(sub, context_of(sub, name, ctx))


def context_of(command: Any, name: str, parent: typer.Context) -> typer.Context:
    """The context click's ``command.make_context(name, args, parent=parent)`` makes, unparsed."""
    return type(parent)(command, info_name=name, parent=parent, **command.context_settings)
