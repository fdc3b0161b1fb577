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


def test_transfer_learns_only_when_asked_and_separates_waiting_from_rate():
    model = TransferTimeModel(bytes_per_token=100, bandwidth=1e6, latency=0.0)
    assert model.predict(1000) == pytest.approx(0.1)
    model.observe(1000, 0.3)
    assert model.predict(1000) == pytest.approx(0.1)
    model.learn = True
    # A congested source: every pull waits 0.5 s, then moves at the nominal 1e-4 s/token.
    for _ in range(300):
        for tokens in (500, 5000, 20000):
            model.observe(tokens, 0.5 + tokens * 1e-4)
    assert model.fixed == pytest.approx(0.5, rel=1e-3)
    assert model.seconds_per_token == pytest.approx(1e-4, rel=1e-3)
