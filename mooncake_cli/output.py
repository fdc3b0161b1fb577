"""How every command speaks: results to stdout (a rich table or --json), diagnostics to stderr.

Exit codes are part of the scripting contract: 0 success, 1 the operation failed, 2 usage error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn
from collections.abc import Callable

import typer

from daemons.errors import DaemonStartFailed
from transfer.errors import MooncakeError

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Piped into a file or another program there is no terminal to fit: rich would then squeeze a
# table into 80 columns and cut its numbers short ("17…"), so such output gets room to be whole.
# COLUMNS, when set, still wins, as rich's own default does.
PIPED_WIDTH = 240


class _Console:
    """A rich Console made on first use: rich takes ~20 ms to import, and a `mooncake get` or
    `exists` that succeeds prints nothing through one."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


stdout = _Console(soft_wrap=True, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH)
stderr = _Console(stderr=True, soft_wrap=True)

JSON_HELP = "Print the result as JSON (stable schema) instead of a table."
LOAD_HELP = ("CPU-bound processes to run beside the measurement, from start to end: the figures of a host "
             "another program keeps busy.")


def emit(data: Any, as_json: bool, render: Callable[[Any], Any]) -> None:
    """Print ``data`` as JSON, or hand it to ``render`` which returns something rich can print."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
    else:
        stdout.print(render(data))


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    stderr.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def fail_on(exc: MooncakeError) -> NoReturn:
    fail(f"{exc.message} ({exc.name}, code {exc.code})")


def fail_to_start(exc: DaemonStartFailed) -> NoReturn:
    """A daemon that did not come up: why, and the last lines of its log."""
    stderr.print(f"[red]error:[/red] {exc.message}\n--- last lines of its log ---\n{exc.log_tail}",
                 highlight=False, markup=True)
    raise typer.Exit(EXIT_FAILED)


def show_progress() -> bool:
    """Progress bars only on a terminal: scripts and pipes stay quiet."""
    return stderr.is_terminal
