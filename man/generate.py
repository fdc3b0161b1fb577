"""Generate the man pages of `mooncake` from the typer app and the settings registry.

    python man/generate.py            # rewrite man/*.1
    python man/generate.py --check    # exit 1 if a page is missing, stale or orphaned

One page per command path (`mooncake.1`, `mooncake-up.1`, `mooncake-bench-rpc.1`, ...). Option
help comes from the same click parameters the CLI parses, and the ENVIRONMENT sections list the
registry's MOONCAKE_* variables, so the pages cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_cli.app import app  # noqa: E402
from transfer.settings import SETTINGS, setting  # noqa: E402

MAN_DIR = Path(__file__).resolve().parent
DATE = "2026"
SETTING_FLAGS = {s.flag: s for s in SETTINGS}


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines())


# typer ships its own copy of click, so commands are recognised by shape, not by class.
Command = Any


def _is_group(command: Command) -> bool:
    return hasattr(command, "commands")


def _options(command: Command) -> list:
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


def _commands(command: Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Command]]:
    found = [(path, command)]
    if _is_group(command):
        for name in sorted(command.commands):
            found += _commands(command.commands[name], path + (name,))
    return found


def _synopsis(path: tuple[str, ...], command: Command) -> str:
    words = [f"\\fB{' '.join(path)}\\fR"]
    if _is_group(command):
        words.append("\\fICOMMAND\\fR [\\fIARGS\\fR]...")
    else:
        words.append("[\\fIOPTIONS\\fR]")
        words += [f"[\\fI{p.name.upper()}\\fR]" if not p.required else f"\\fI{p.name.upper()}\\fR"
                  for p in command.params if p.param_type_name == "argument"]
    return " ".join(words)


def _option_lines(command: Command) -> list[str]:
    lines = []
    for param in _options(command):
        names = ", ".join(f"\\fB{_escape(o)}\\fR" for o in param.opts + param.secondary_opts)
        metavar = "" if param.is_flag else " \\fIVALUE\\fR"
        lines += [".TP", names + metavar, _escape(param.help or "")]
    return lines


def _environment_lines(command: Command, everything: bool) -> list[str]:
    if everything:
        specs = list(SETTINGS)
    else:
        flags = {o for p in _options(command) for o in p.opts}
        specs = [SETTING_FLAGS[f] for f in flags if f in SETTING_FLAGS]
        specs.sort(key=lambda s: SETTINGS.index(s))
    if not specs:
        return []
    lines = [".SH ENVIRONMENT",
             "Each setting is read, highest precedence first, from its flag, its environment "
             "variable, the \\fB\\-\\-config\\fR YAML file, and its default."]
    for spec in specs:
        default = spec.default_text or "(empty)"
        lines += [".TP", f"\\fB{spec.env_var}\\fR", _escape(f"{spec.help} Default: {default}.")]
    return lines


def render_page(path: tuple[str, ...], command: Command) -> str:
    title = "-".join(path)
    help_text = (command.help or "").strip()
    summary = help_text.splitlines()[0] if help_text else ""
    lines = [
        f'.TH {_escape(title.upper())} 1 "{DATE}" "mooncake-py" "Mooncake manual"',
        ".SH NAME", f"{_escape(title)} \\- {_escape(summary)}",
        ".SH SYNOPSIS", _synopsis(path, command),
        ".SH DESCRIPTION", _escape(help_text) or "(no description)",
    ]
    if _is_group(command):
        lines.append(".SH COMMANDS")
        for name in sorted(command.commands):
            sub = command.commands[name]
            first = (sub.help or "").strip().splitlines()[0] if sub.help else ""
            lines += [".TP", f"\\fB{_escape(name)}\\fR", _escape(first) + f" See \\fB{_escape(title + '-' + name)}\\fR(1)."]
    options = _option_lines(command)
    if options:
        lines += [".SH OPTIONS", *options]
    lines += _environment_lines(command, everything=len(path) == 1)
    lines += [".SH EXIT STATUS", "0 on success, 1 when the operation failed, 2 on a usage error.",
              ".SH FILES",
              _escape(f"{setting('workdir').default}/cluster.json, settings.yaml, run/, logs/: the state of "
                      "one cluster (see --workdir).")]
    if len(path) > 1:
        lines += [".SH SEE ALSO", "\\fBmooncake\\fR(1)"]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    root = typer.main.get_command(app)
    return {"-".join(path) + ".1": render_page(path, command)
            for path, command in _commands(root, ("mooncake",))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report missing or stale pages")
    args = parser.parse_args()
    wanted = pages()
    existing = {p.name for p in MAN_DIR.glob("*.1")}
    problems = [f"missing: {n}" for n in sorted(set(wanted) - existing)]
    problems += [f"orphaned: {n}" for n in sorted(existing - set(wanted))]
    problems += [f"stale: {n}" for n in sorted(set(wanted) & existing)
                 if (MAN_DIR / n).read_text() != wanted[n]]
    if args.check:
        print("\n".join(problems) or "man pages are up to date")
        return 1 if problems else 0
    for name in existing - set(wanted):
        (MAN_DIR / name).unlink()
    for name, text in wanted.items():
        (MAN_DIR / name).write_text(text)
    print(f"wrote {len(wanted)} pages to {MAN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
