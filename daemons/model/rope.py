"""Rotary position embeddings: which frequencies a checkpoint's config.json asks for (applying
them is ``layers.py``'s; this module needs no torch, so the conductor reads a config without it).

Config files name the same thing two ways: older ones have ``rope_theta`` and ``rope_scaling``
({"type" or "rope_type", "factor", ...}) at the top level, those saved by today's transformers a
single ``rope_parameters`` ({"rope_type", "rope_theta", ...}). Both are read; a scaling this
decoder does not implement is refused rather than run as plain RoPE, which would compute wrong
logits without a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
