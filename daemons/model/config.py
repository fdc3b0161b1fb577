"""The shape of a Llama-style decoder, and its mapping to a Hugging Face config.json.

Four architectures share this decoder; they differ only in a few switches:

    llama    biases on q/k/v/o as ``attention_bias`` says, on the MLP as ``mlp_bias`` says
    mistral  Llama's shape; a sliding window shorter than the context is refused
    qwen2    biases on q/k/v (not o); tied embeddings where the config says so
    qwen3    per-head RMSNorm on queries and keys before the rotation (``q_norm``/``k_norm``)

Anything else a config.json sets that changes the math, and this decoder does not implement, is
refused with a one-line :class:`CheckpointError` instead of being ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemons.model.errors import CheckpointError
from daemons.model.rope import Rope

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")  # torch's names for them
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 259  # 256 bytes + BOS, EOS, PAD of the byte tokenizer
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope: Rope = field(default_factory=Rope)
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = 256
    eos_token_id: int | None = 257
    # Llama 3 and Qwen end a turn with tokens besides EOS (config.json's or generation_config.json's
    # eos_token_id list): a generation stops at any of them.
    other_stop_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV groups")
        if self.head_dim % 2:
            raise ValueError("rotary embeddings need an even head_dim")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {self.architecture!r}")

    @classmethod
    def tiny(cls, *, layers: int = 4, hidden_size: int = 128, heads: int = 4, kv_heads: int = 2,
             dtype: str = "float32") -> ModelConfig:
        """The default random model: small enough to prefill and decode on a CPU in milliseconds."""
        return cls(hidden_size=hidden_size, intermediate_size=3 * hidden_size, num_layers=layers,
                   num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden_size // heads, dtype=dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # here: the conductor reads configs, and never needs torch

        return getattr(torch, self.dtype)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Every id that ends a generation."""
        ids = set(self.other_stop_token_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return frozenset(ids)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None,
                generation: dict[str, Any] | None = None) -> ModelConfig:
        """Read a config.json (and generation_config.json's stop tokens); refuse what this decoder
        does not implement."""
        arch = hf.get("model_type")
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"model_type {arch!r} is not one of the architectures this decoder runs: "
                                  f"{', '.join(sorted(ARCHITECTURES))}")
        _refuse_unimplemented(hf)
        heads = hf["num_attention_heads"]
        attention_bias = bool(hf.get("attention_bias", False))
        eos = token_ids(hf.get("eos_token_id")) + token_ids((generation or {}).get("eos_token_id"))
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope=Rope.from_hf(hf), rms_norm_eps=float(hf["rms_norm_eps"]),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or (arch in ("llama", "qwen3") and attention_bias),
            o_proj_bias=arch in ("llama", "qwen3") and attention_bias,
            mlp_bias=arch == "llama" and bool(hf.get("mlp_bias", False)),
            qk_norm=arch == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos[0] if eos else None,
            other_stop_token_ids=tuple(dict.fromkeys(eos[1:])),
            architecture=arch,
            dtype=dtype or _dtype_name(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
        )

    def to_hf(self) -> dict[str, Any]:
        hf = {
            "architectures": [ARCHITECTURES[self.architecture]], "model_type": self.architecture,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "hidden_act": "silu", "rope_parameters": self.rope.to_hf(),
            "rms_norm_eps": self.rms_norm_eps, "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": [self.eos_token_id, *self.other_stop_token_ids] if self.other_stop_token_ids
            else self.eos_token_id,
            "dtype": self.dtype,
        }
        if self.architecture in ("llama", "qwen3"):
            hf["attention_bias"] = self.o_proj_bias
        if self.architecture == "llama":
            hf["mlp_bias"] = self.mlp_bias
        if self.architecture == "mistral":
            hf["sliding_window"] = None
        return hf


def token_ids(value: Any) -> list[int]:
    """An ``eos_token_id`` entry (one id, a list of them, or null) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _refuse_unimplemented(hf: dict[str, Any]) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json sets hidden_act {hf['hidden_act']!r}; this decoder implements silu")
    if hf.get("quantization_config"):
        raise CheckpointError("config.json describes quantized weights, which this decoder does not load")
    context = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window") if hf["model_type"] == "mistral" else None
    if hf["model_type"] in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        # Qwen slides only where use_sliding_window is set, and then only in the layers that
        # layer_types marks (by default those from max_window_layers on).
        layers = hf.get("layer_types") or ["sliding_attention" if i >= hf.get("max_window_layers", 28) else ""
                                           for i in range(hf["num_hidden_layers"])]
        window = hf.get("sliding_window") if "sliding_attention" in layers else None
    if window is not None and window < context:
        raise CheckpointError(f"config.json sets a sliding window of {window} tokens, shorter than the "
                              f"{context}-token context; this decoder attends to the whole context")


def _dtype_name(name: str) -> str:
    # Checkpoints in float16/bfloat16 run in their own dtype; anything unknown falls back to float32.
    return name if name in DTYPES else "float32"


def read_json(file: Path, *, required: bool) -> dict[str, Any]:
    """A JSON object from ``file`` (a checkpoint's config or tokenizer file); {} for an optional
    file that is not there."""
    if not required and not file.exists():
        return {}
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} does not hold a JSON object")
    return value
