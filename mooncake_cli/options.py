"""Typer flags generated from the settings registry.

``@settings_options("cluster", "rpc", "sysfs_root")`` appends one ``--flag`` per setting of those
sections (or named singly), plus ``--config FILE``, to a command's signature. Boolean settings
are bare switches (``--include-virtual/--no-include-virtual``). When the command runs, the flags the user gave are
resolved with the environment, the config file and the defaults into one :class:`Config`, which
the command receives as its ``config`` parameter. Help text and defaults come from the registry.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any
from collections.abc import Callable

import typer

from transfer.settings import (
    SECTIONS, SETTINGS, SIZE_UNITS_HELP, Config, Setting, SettingError, resolve, setting, settings_in,
)

CONFIG_HELP = "YAML file of settings (keys are setting names); flags and MOONCAKE_* env vars win over it."


def _option_for(spec) -> inspect.Parameter:
    units = f" {SIZE_UNITS_HELP}" if spec.kind == "size" else ""
    help_text = f"{spec.help}{units} [default: {spec.default_text or 'none'}; env {spec.env_var}]"
    is_switch = spec.kind == "bool"
    flags = f"{spec.flag}/--no-{spec.flag[2:]}" if is_switch else spec.flag
    option = typer.Option(None, flags, *spec.aliases, help=help_text, show_default=False,
                          rich_help_panel=f"Settings: {spec.section}")
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=bool | None if is_switch else str | None)


def _specs(names: tuple[str, ...]) -> list[Setting]:
    picked = {s.name for s in settings_in(n for n in names if n in SECTIONS)}
    picked |= {n for n in names if n not in SECTIONS and setting(n)}
    return [s for s in SETTINGS if s.name in picked]


def settings_options(*sections_or_names: str) -> Callable[[Callable], Callable]:
    # No flag for a secret: a command line is readable by every user through ps and /proc.
    specs = [spec for spec in _specs(sections_or_names) if not spec.hidden]

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        own = [p for name, p in signature.parameters.items() if name != "config"]
        extra = [_option_for(spec) for spec in specs]
        config_file = inspect.Parameter(
            "config_file", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
            default=typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
        )

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            flags = {spec.name: kwargs.pop(spec.name, None) for spec in specs}
            try:
                config = resolve(flags, kwargs.pop("config_file", None))
            except SettingError as exc:
                raise typer.BadParameter(str(exc)) from None
            return command(*args, config=config, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*own, *extra, config_file])
        return wrapper

    return decorate


__all__ = ["settings_options", "Config"]
