"""Predictors recover their models by least squares; the transfer model learns achieved rates."""

import numpy as np
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


def test_fits_never_give_a_cost_term_a_negative_weight():
    # Noisy timings of a loaded machine: a free fit bends the quadratic term negative and the
    # fixed term up, planning a 2000-token prompt as cheaper than a 1000-token one.
    samples = [(64, 0, 0.09), (256, 0, 0.12), (576, 512, 0.10), (512, 0, 0.16), (384, 256, 0.11),
               (768, 512, 0.13), (1024, 0, 0.15)]
    free = np.linalg.lstsq(np.array([[1.0, n - p, (n - p) * p + (n - p) ** 2 / 2] for n, p, _ in samples]),
                           np.array([t for *_, t in samples]), rcond=None)[0]
    assert min(free) < 0
    model = PrefillTimeModel.fit(samples)
    assert min(model.coef) >= 0 and model.predict(2000, 0) >= model.predict(1000, 0)
    decode = DecodeTbtModel.fit([(1, 100, 0.03), (8, 800, 0.02), (4, 2000, 0.05), (2, 50, 0.031)])
    assert min(decode.coef) >= 0
