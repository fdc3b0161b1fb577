"""The settings registry: parsing, precedence, and the messages a user sees for bad values."""

from __future__ import annotations

import pytest

from transfer.errors import SettingError
from transfer.settings import SETTINGS, parse_duration, parse_size, resolve, setting


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), (4096, 4096), ("64KiB", 65536), ("1GiB", 2**30),
    # One meaning for every unit, Mooncake's: 512MB is 512 MiB, as compat's setup reads it.
    ("512MB", 512 * 2**20), ("256 mb", 256 * 2**20), ("4k", 4096), ("2Gi", 2 * 2**30),
    ("16 MiB", 16 * 2**20), ("1.5KiB", 1536),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("500ms", 0.5), ("10s", 10.0), ("30m", 1800.0), ("2h", 7200.0), ("7", 7.0), (3, 3.0),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("name, value, accepted", [
    ("rpc_max_message_size", "12XB", "64KiB"),
    ("rpc_max_message_size", "-5", "64KiB"),
    ("rpc_max_message_size", "1.5", "64KiB"),
    ("rpc_timeout", "soon", "500ms"),
    ("rpc_handler_threads", "0", ">= 1"),
    ("include_virtual", "maybe", "true or false"),
])
def test_bad_values_name_the_setting_the_value_and_what_is_accepted(name, value, accepted):
    with pytest.raises(SettingError) as info:
        setting(name).parse(value)
    message = str(info.value)
    assert f"'{name}'" in message and repr(value) in message and accepted in message


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    config_file = tmp_path / "mooncake.yaml"
    config_file.write_text("rpc_timeout: 7s\nstop-grace: 9s\ndrain_timeout: 1m\n")
    env = {"MOONCAKE_RPC_TIMEOUT": "3s", "MOONCAKE_STOP_GRACE": "2s"}
    config = resolve({"rpc_timeout": "250ms", "start_timeout": None}, config_file, env)
    assert (config.rpc_timeout, config.sources["rpc_timeout"]) == (0.25, "flag")
    assert (config.stop_grace, config.sources["stop_grace"]) == (2.0, "env")
    assert (config.drain_timeout, config.sources["drain_timeout"]) == (60.0, "file")
    assert (config.start_timeout, config.sources["start_timeout"]) == (20.0, "default")


def test_unknown_key_in_config_file_is_refused(tmp_path):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text("rpc_timeot: 3s\n")
    with pytest.raises(SettingError, match="rpc_timeot"):
        resolve({}, config_file, {})


def test_bad_env_value_is_reported_with_the_setting_name():
    with pytest.raises(SettingError, match="'stop_grace'"):
        resolve({}, None, {"MOONCAKE_STOP_GRACE": "forever"})


def test_every_default_parses_and_renders_back_to_itself():
    for spec in SETTINGS:
        value = spec.parse(spec.default)
        assert spec.parse(spec.render(value)) == value, spec.name


def test_model_device_takes_cpu_cuda_or_a_numbered_cuda_device():
    spec = setting("model_device")
    assert [spec.parse(v) for v in ("cpu", "cuda", "cuda:0", "cuda:3")] == ["cpu", "cuda", "cuda:0", "cuda:3"]
    for bad in ("gpu", "cuda:", "cuda:x", "CUDA", "cpu:0", "mps"):
        with pytest.raises(SettingError, match="cpu, cuda .* or cuda:N"):
            spec.parse(bad)
    assert spec.default == "cpu" and spec.aliases == ("--device",)
