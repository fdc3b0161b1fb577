"""Predictors recover their models by least squares; the transfer model learns achieved rates."""

import pytest

from scheduler.predictors import DecodeTbtModel, PrefillTimeModel, TransferTimeModel


def test_prefill_fit_recovers_a_quadratic_model():
    truth = PrefillTimeModel((0.05, 2e-4, 3e-9))
    samples = [(n, p, truth.predict(n, p)) for n in (1000, 4000, 16000, 64000) for p in (0, 512, 2048)]
    fitted = PrefillTimeModel.fit(samples)
    assert fitted.coef == pytest.approx(truth.coef, rel=1e-6)
    assert fitted.predict(8000, 4000) == pytest.approx(truth.predict(8000, 4000))


def test_prefill_time_counts_only_new_tokens():
    model = PrefillTimeModel((0.0, 1e-3, 0.0))
    assert model.predict(1000, 400) == pytest.approx(0.6)
    assert model.predict(1000, 1000) == 0.0


def test_decode_fit_and_predict():
    truth = DecodeTbtModel((0.02, 0.001, 5e-8))
    samples = [(b, c, truth.predict(b, c)) for b in (1, 8, 32) for c in (1000, 100000)]
    assert DecodeTbtModel.fit(samples).coef == pytest.approx(truth.coef, rel=1e-6)
    assert truth.predict(0, 0) == 0.0


def test_transfer_learns_only_when_asked():
    model = TransferTimeModel(bytes_per_token=100, bandwidth=1e6, latency=0.0)
    assert model.predict(1000) == pytest.approx(0.1)
    model.observe(1000, 0.3)
    assert model.predict(1000) == pytest.approx(0.1)
    model.learn, model.smoothing = True, 0.5
    model.observe(1000, 0.3)  # halfway from 1e-4 to 3e-4 s/token
    assert model.predict(1000) == pytest.approx(0.2)
