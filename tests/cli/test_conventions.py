"""Scripting conventions of the `mooncake` command: exit codes, --json, settings from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_config_show_reports_value_and_source_for_every_layer(mooncake, tmp_path):
    config_file = tmp_path / "mooncake.yaml"
    config_file.write_text("drain_timeout: 2m\nstop_grace: 9s\n")
    data = mooncake.json("config", "show", "--config", str(config_file), "--rpc-timeout", "750ms",
                         "--segment-size", "256MB", env={"MOONCAKE_STOP_GRACE": "4s"})
    rows = {row["name"]: row for row in data["settings"]}
    assert rows["segment_size"]["value"] == "256MiB"  # one size grammar: MB is binary, as compat's
    assert (rows["rpc_timeout"]["value"], rows["rpc_timeout"]["source"]) == ("750ms", "flag")
    assert (rows["stop_grace"]["value"], rows["stop_grace"]["source"]) == ("4s", "env")
    assert (rows["drain_timeout"]["value"], rows["drain_timeout"]["source"]) == ("2m", "file")
    assert rows["start_timeout"]["source"] == "default"
    assert data["config_file"] == str(config_file)


def test_bad_setting_value_is_a_usage_error_naming_setting_and_accepted_values(mooncake):
    result = mooncake("config", "show", "--rpc-max-message-size", "lots")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "rpc_max_message_size" in err and "'lots'" in err and "64KiB" in err
    assert result.stdout == b""


def test_bad_env_value_is_a_usage_error(mooncake):
    result = mooncake("config", "show", env={"MOONCAKE_START_TIMEOUT": "eventually"})
    assert result.returncode == 2
    assert b"start_timeout" in result.stderr


def test_unknown_command_is_a_usage_error(mooncake):
    assert mooncake("frobnicate").returncode == 2


def test_status_json_is_parseable_even_when_failing(mooncake):
    mooncake.json("up")
    result = mooncake("status", "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["healthy"] is True


def test_a_piped_table_keeps_every_number_whole():
    """Piped into a file there is no terminal width to fit: a wide table must not be cut to 80
    columns with its numbers shortened to "…" (scripts and notes read these tables)."""
    code = ("from rich.table import Table\nfrom mooncake_cli.output import emit\n"
            "table = Table(*[f'column {i}' for i in range(12)])\n"
            "table.add_row(*[f'{i * 123456.789:.3f}' for i in range(12)])\n"
            "emit({}, False, lambda data: table)\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, cwd=REPO, check=True)
    text = result.stdout.decode()
    assert "…" not in text and all(f"{i * 123456.789:.3f}" in text for i in range(12))
