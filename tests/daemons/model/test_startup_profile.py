"""A worker's start-up profile: KV bytes from the layout, fitted prefill and decode costs, bounded."""

import pytest
import torch

from daemons.model import KVCacheLayout, ModelConfig, random_model
from daemons.serving.messages import WorkerCalibration
from daemons.workers.calibration import MIN_SHAPES, calibrate, fit_decode, fit_prefill, kv_bytes_per_token, \
    profile_decode, profile_prefill
from transfer.errors import InvalidArgument


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return random_model(ModelConfig.tiny(layers=2, hidden_size=32, heads=2, kv_heads=1), seed=0)


def test_kv_bytes_per_token_is_the_layouts():
    # 4 layers x (K, V) x 2 KV heads x 32 dims x 4 bytes: the default tiny model's 2 KiB.
    layout = KVCacheLayout.for_model(ModelConfig.tiny(), 32, 8)
    assert kv_bytes_per_token(layout) == 4 * 2 * 2 * 32 * 4 == 2048


def test_profiles_fit_models_of_this_machine(model):
    prefill = profile_prefill(model, 16, budget_s=5.0)
    # Every shape ran; prefixes are whole blocks; the input counts the prefix.
    assert len(prefill) == 6 and all(p % 16 == 0 and n > p for n, p, _ in prefill)
    coef = fit_prefill(prefill)
    assert coef is not None and all(c >= 0 for c in coef)
    decode = profile_decode(model, 16, budget_s=5.0)
    assert [b for b, _, _ in decode] == [1, 8, 4, 1, 8] and all(s > 0 for _, _, s in decode)
    assert fit_decode(decode) is not None


def test_a_spent_budget_stops_adding_shapes_once_a_fit_is_possible(model):
    prefill, decode = profile_prefill(model, 16, budget_s=0.0), profile_decode(model, 16, budget_s=0.0)
    assert len(prefill) == len(decode) == MIN_SHAPES  # the cheapest shapes, enough for 3 terms
    assert fit_prefill(prefill) is not None and fit_decode(decode) is not None
    assert fit_prefill(prefill[:2]) is None  # too few to fit: left out, the conductor keeps its own


def test_calibration_travels_and_zero_budget_measures_nothing(model):
    layout = KVCacheLayout.for_model(model.config, 16, 4)
    skipped = calibrate("prefill", model, layout, 0.0)
    assert skipped == WorkerCalibration(kv_bytes_per_token(layout))
    assert skipped.to_wire() == {"kv_bytes_per_token": kv_bytes_per_token(layout)}
    decode = calibrate("decode", model, layout, 5.0)
    assert decode.tbt_coef is not None and decode.prefill_coef is None and decode.transfer_bandwidth is None
    assert WorkerCalibration.from_wire(decode.to_wire()) == decode
    with pytest.raises(InvalidArgument, match="tbt_coef needs 3 coefficients"):
        WorkerCalibration.from_wire({"kv_bytes_per_token": 1, "tbt_coef": [1.0]})
