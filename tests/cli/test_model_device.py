"""`--model-device` (or its alias `--device`) names a device this host lacks: `up`, `start
prefill|decode` and `bench prefill` refuse in one line before any daemon starts, rather than with
a worker's crash log."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import Mooncake

REFUSAL = "error: model_device {}: this host has no usable CUDA device (torch.cuda.is_available() is false) " \
          "(DEVICE_UNAVAILABLE, code -1093)"


@pytest.fixture
def runner(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the refusal cannot happen here")
    return Mooncake(tmp_path / "cluster")


@pytest.mark.parametrize("args, device", [
    (["up", "--model-device", "cuda"], "cuda"),
    (["start", "prefill", "--device", "cuda:1"], "cuda:1"),
    (["start", "decode", "--device", "cuda"], "cuda"),
    (["bench", "prefill", "--device", "cuda", "--lengths", "64"], "cuda"),
])
def test_cuda_on_a_host_without_it_is_refused_before_anything_starts(runner, args, device):
    result = runner(*args, env={"MOONCAKE_PREFILL_WORKERS": "1"})
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [REFUSAL.format(device)]
    assert not (runner.workdir / "cluster.json").exists() and not (runner.workdir / "run").exists()

