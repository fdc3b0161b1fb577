"""Predictors the conductor plans with: prefill time, transfer time, decode TBT.

Each is a small model with ``predict`` and a way to learn: the prefill and TBT models are fitted by
non-negative least squares from samples (a worker's start-up profile, or what workers report), the transfer model keeps
a moving average of the rate transfers actually achieved, because the nominal link bandwidth
ignores congestion at a hot source — the hardest part to predict, as the paper says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence

import numpy as np


def _with_prior(x: np.ndarray, y: np.ndarray, prior: Sequence[float], weight: float) -> tuple[np.ndarray, np.ndarray]:
    """The samples plus ``prior`` as ``weight`` samples' worth of evidence: one row per term,
    that term alone at its typical size in the samples (its root mean square), timed as the
    prior says. Each row's residual is how many seconds the fit moves that term's share of a
    typical sample away from the prior; the rows make every term determined, so a few samples
    of one shape bend the prior along what they show instead of inventing a curve."""
    scale = np.sqrt(np.mean(x * x, axis=0))
    scale[scale == 0] = 1.0  # a term no sample exercises: its row alone pins it to the prior
    rows = np.diag(scale) * np.sqrt(weight / x.shape[1])
    return np.vstack([x, rows]), np.concatenate([y, rows @ np.asarray(prior, dtype=float)])


def _nonnegative_fit(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, ...]:
    """Least squares with every coefficient >= 0 (exact for a handful of terms: the best of the
    unconstrained fits over every subset of the terms whose coefficients all come out >= 0).

    Each term is a cost that only grows with its feature; a free fit over noisy timings (a loaded
    machine, a narrow length mix) can give one a negative weight, and then a longer prompt or a
    bigger batch is planned as cheaper than a shorter one. ValueError when the samples do not
    determine the full model (too few distinct rows): lstsq would invent a curve through them."""
    if np.linalg.matrix_rank(x) < x.shape[1]:
        raise ValueError(f"{what} samples do not determine the model")
    terms = x.shape[1]
    best, best_residual = np.zeros(terms), float(np.sum(y * y))
    for mask in range(1, 2**terms):
        used = [t for t in range(terms) if mask >> t & 1]
        coef, _, _, _ = np.linalg.lstsq(x[:, used], y, rcond=None)
        if np.any(coef < 0):
            continue
        residual = float(np.sum((x[:, used] @ coef - y) ** 2))
        if residual < best_residual:
            best, best_residual = np.zeros(terms), residual
            best[used] = coef
    return tuple(float(c) for c in best)


def _prefill_features(input_len: float, prefix_len: float) -> list[float]:
    # Work grows linearly in the new tokens (MLP, projections) and with new x all tokens
    # (attention): new*prefix + new^2/2 counts the causal (query, key) pairs.
    new = max(input_len - prefix_len, 0.0)
    return [1.0, new, new * prefix_len + new * new / 2.0]


@dataclass
class PrefillTimeModel:
    """Seconds to prefill ``input_len`` tokens of which ``prefix_len`` are cached."""

    coef: tuple[float, float, float] = (0.02, 1.12e-4, 2.1e-9)

    def predict(self, input_len: int, prefix_len: int) -> float:
        c0, c1, c2 = self.coef
        new = max(input_len - prefix_len, 0)
        return c0 + c1 * new + c2 * (new * prefix_len + new * new / 2.0)

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]], prior: PrefillTimeModel | None = None,
            prior_weight: float = 0.0) -> PrefillTimeModel:
        """Least squares over (input_len, prefix_len, seconds) samples; with a ``prior`` model
        and ``prior_weight`` > 0, that model counts as that many samples (:func:`_with_prior`)."""
        if not samples or (len(samples) < 3 and not (prior and prior_weight > 0)):
            raise ValueError("need at least 3 samples to fit the prefill model")
        x = np.array([_prefill_features(n, p) for n, p, _ in samples])
        y = np.array([t for _, _, t in samples])
        if prior is not None and prior_weight > 0:
            x, y = _with_prior(x, y, prior.coef, prior_weight)
        return cls(_nonnegative_fit(x, y, "prefill"))  # type: ignore[arg-type]


@dataclass
class TransferTimeModel:
    """Seconds to move ``num_tokens`` of KV from another location into a prefill instance.

    ``predict`` is ``fixed + num_tokens * seconds_per_token``. Learning (for the auto threshold)
    fits both terms by exponentially weighted least squares over observed transfers: a hot
    source's queue adds a wait per transfer, not per token, so a per-token rate alone would make
    a small transfer that waited look as if every large one must crawl.
    """

    bytes_per_token: int = 327680
    bandwidth: float = 12.5e9  # bytes/s, the nominal link
    latency: float = 0.001
    learn: bool = False
    decay: float = 0.98  # weight kept by past observations at each new one
    seconds_per_token: float = field(init=False)
    fixed: float = field(init=False)

    def __post_init__(self) -> None:
        self.seconds_per_token = self.bytes_per_token / self.bandwidth
        self.fixed = self.latency
        # Prior: two pseudo-observations on the nominal line, so few samples cannot run wild.
        big = 16384.0
        self._sums = [2.0, big, big * big, 2 * self.latency + big * self.seconds_per_token,
                      big * (self.latency + big * self.seconds_per_token)]

    def predict(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.fixed + num_tokens * self.seconds_per_token

    def observe(self, num_tokens: int, seconds: float) -> None:
        if not self.learn or num_tokens <= 0:
            return
        w, x, y = self.decay, float(num_tokens), seconds
        s0, s1, s2, t0, t1 = (v * w for v in self._sums)
        self._sums = [s0 + 1, s1 + x, s2 + x * x, t0 + y, t1 + x * y]
        s0, s1, s2, t0, t1 = self._sums
        det = s0 * s2 - s1 * s1
        if det <= 1e-12 * s2 * s0:
            return  # all recent transfers had the same size: the slope is not identified
        slope = (s0 * t1 - s1 * t0) / det
        self.seconds_per_token = max(slope, 0.0)
        self.fixed = max((t0 - slope * s1) / s0, 0.0)


@dataclass
class DecodeTbtModel:
    """Seconds per decode step for a batch of ``batch`` sequences holding ``context`` tokens."""

    coef: tuple[float, float, float] = (0.030, 0.0015, 1e-7)

    def predict(self, batch: int, context: int) -> float:
        if batch <= 0:
            return 0.0
        c0, c1, c2 = self.coef
        return c0 + c1 * batch + c2 * context

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> DecodeTbtModel:
        """Least squares over (batch, context_tokens, seconds_per_step) samples."""
        if len(samples) < 3:
            raise ValueError("need at least 3 samples to fit the decode model")
        x = np.array([[1.0, b, c] for b, c, _ in samples])
        y = np.array([t for _, _, t in samples])
        # E.g. one request decoding alone: batch never varies, so its slope is not identified.
        return cls(_nonnegative_fit(x, y, "decode"))  # type: ignore[arg-type]
