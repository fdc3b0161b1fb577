"""The shape of a Llama-style decoder, and its mapping to a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from daemons.model.errors import CheckpointError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 259  # 256 bytes + BOS, EOS, PAD of the byte tokenizer
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int = 256
    eos_token_id: int = 257
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV groups")
        if self.head_dim % 2:
            raise ValueError("rotary embeddings need an even head_dim")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def tiny(cls, *, layers: int = 4, hidden_size: int = 128, heads: int = 4, kv_heads: int = 2,
             dtype: str = "float32") -> ModelConfig:
        """The default random model: small enough to prefill and decode on a CPU in milliseconds."""
        return cls(hidden_size=hidden_size, intermediate_size=3 * hidden_size, num_layers=layers,
                   num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden_size // heads, dtype=dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @classmethod
    def from_hf(cls, hf: dict[str, Any], dtype: str | None = None) -> ModelConfig:
        """Read a Llama config.json; refuse features this decoder does not implement."""
        if hf.get("model_type") != "llama":
            raise CheckpointError(f"model_type {hf.get('model_type')!r} is not a Llama checkpoint")
        for feature in ("rope_scaling", "attention_bias", "mlp_bias"):
            if hf.get(feature):
                raise CheckpointError(f"config.json sets {feature}, which this decoder does not implement")
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=float(hf.get("rope_theta", 10000.0)), rms_norm_eps=float(hf["rms_norm_eps"]),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id", 1),
            # Llama 3 lists several stop tokens; greedy decoding stops at the first one here.
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            dtype=dtype or _dtype_name(hf.get("torch_dtype", "float32")),
        )

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "hidden_act": "silu", "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps, "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
            "torch_dtype": self.dtype,
        }


def _dtype_name(name: str) -> str:
    # Checkpoints in float16/bfloat16 run in their own dtype; anything unknown falls back to float32.
    return name if name in DTYPES else "float32"
