"""Rotary position embeddings: which frequencies a checkpoint's config.json asks for, and applying them.

Config files name the same thing two ways: older ones have ``rope_theta`` and ``rope_scaling``
({"type" or "rope_type", "factor", ...}) at the top level, those saved by today's transformers a
single ``rope_parameters`` ({"rope_type", "rope_theta", ...}). Both are read; a scaling this
decoder does not implement is refused rather than run as plain RoPE, which would compute wrong
logits without a word.

Frequencies follow transformers' ``modeling_rope_utils`` step for step (same float32 operations in
the same order), so angles and logits equal the reference's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from daemons.model.errors import CheckpointError

# Dynamic NTK recomputes every frequency from the current sequence length: the rotation of a key
# would depend on how long its sequence grew later, which KV stored once and reused cannot follow.
_REFUSED = {"dynamic": "dynamic NTK scaling re-rotates cached keys as the sequence grows, "
                       "which KV pages reused from the store cannot follow"}


@dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"  # "default", "linear" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only, like the two below
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Rope:
        """The rotary embedding of a config.json, in either of its spellings."""
        params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        if any(isinstance(value, dict) for value in params.values()):
            raise CheckpointError("config.json sets a rotary embedding per layer type, which this decoder does "
                                  "not implement")
        kind = params.get("rope_type", params.get("type", "default"))
        theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
        if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
            raise CheckpointError("config.json sets partial_rotary_factor, which this decoder does not implement")
        if kind == "default":
            return cls(theta)
        if kind == "linear":
            return cls(theta, kind, float(params["factor"]))
        if kind == "llama3":
            original = params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
            return cls(theta, kind, float(params["factor"]), float(params["low_freq_factor"]),
                       float(params["high_freq_factor"]), int(original))
        reason = _REFUSED.get(kind, "which this decoder does not implement")
        raise CheckpointError(f"config.json asks for rope_type {kind!r}: {reason}")

    def to_hf(self) -> dict[str, Any]:
        """The ``rope_parameters`` entry of a config.json."""
        params: dict[str, Any] = {"rope_type": self.kind, "rope_theta": self.theta}
        if self.kind != "default":
            params["factor"] = self.factor
        if self.kind == "llama3":
            params.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                          original_max_position_embeddings=self.original_max_position_embeddings)
        return params


@functools.cache
def inverse_frequencies(rope: Rope, head_dim: int, device: torch.device | None = None) -> torch.Tensor:
    """float32 [head_dim / 2] on ``device`` (default: the CPU): the angle per position of each
    pair of dimensions. Computed on the CPU for every device, as transformers does, then moved."""
    if device is not None and device.type != "cpu":
        return inverse_frequencies(rope, head_dim).to(device)
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        # Long wavelengths are stretched by ``factor``, short ones kept, those between blended.
        old_context = rope.original_max_position_embeddings
        low_freq_wavelen = old_context / rope.low_freq_factor
        high_freq_wavelen = old_context / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [tokens, heads, head_dim] at absolute ``positions`` [tokens].

    Uses the half-split ("rotate_half") convention of Hugging Face checkpoints, whose q_proj/k_proj
    rows are permuted for it. Angles are computed from the absolute position, so a token's rotated
    key is the same whether its block was computed now or loaded from the store.
    """
    half = x.shape[-1] // 2
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    both = torch.cat((angles, angles), -1)[:, None, :]
    cos, sin = both.cos().to(x.dtype), both.sin().to(x.dtype)
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated_half * sin
