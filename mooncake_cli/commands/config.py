"""`mooncake config show`: every effective setting and where its value came from."""

from __future__ import annotations

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
from mooncake_cli.output import JSON_HELP, emit
from transfer.settings import SECTIONS, SETTINGS

app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)


@app.command("show")
@settings_options(*SECTIONS)
def show(json_output: bool = typer.Option(False, "--json", help=JSON_HELP), *, config: Config) -> None:
    """Print every setting's effective value and its source (default, file, env, flag)."""
    rows = [
        {"name": s.name, "section": s.section, "value": s.render(config[s.name]),
         "source": config.sources[s.name], "env": s.env_var}
        for s in SETTINGS
    ]
    data = {"config_file": config.config_file, "settings": rows}

    def render(data: dict) -> Table:
        table = Table("setting", "value", "source", "section", title="effective settings")
        for row in data["settings"]:
            table.add_row(row["name"], row["value"], row["source"], row["section"])
        return table

    emit(data, json_output, render)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="config")


__all__ = ["register"]
