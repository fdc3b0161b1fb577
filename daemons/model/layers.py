"""The pieces of a Llama-style decoder layer: RMSNorm, GQA projections (with the biases and the
q/k norms some architectures add), SwiGLU, and the rotary embedding (of the frequencies that
``rope.py`` reads from a config.json).

Module and parameter names copy Hugging Face's ``LlamaForCausalLM`` (``self_attn.q_proj``,
``self_attn.q_norm``, ``mlp.gate_proj``, ``input_layernorm`` ...), which Qwen2, Qwen3 and Mistral
share, so a checkpoint's tensor names are this model's state-dict keys and loading needs no
renaming table. Attention itself is not here: the layer
only turns hidden states into (q, k, v) and an attention output back into hidden states, so the
same layer serves the dense reference and the paged KV cache.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torch.nn import functional as F

from daemons.model.config import ModelConfig
from daemons.model.rope import Rope


# Frequencies follow transformers' ``modeling_rope_utils`` step for step (same float32 operations in
# the same order), so angles and logits equal the reference's.
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


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as Llama does, so half-precision checkpoints keep their accuracy.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:  # Qwen3: each head's query and key normalised before the rotation
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.self_attn = SelfAttention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [T, heads, D] and rotated keys and values [T, kv_heads, D] of hidden states x [T, hidden]."""
        c, attn = self.config, self.self_attn
        h = self.input_layernorm(x)
        q = attn.q_proj(h).view(-1, c.num_heads, c.head_dim)
        k = attn.k_proj(h).view(-1, c.num_kv_heads, c.head_dim)
        v = attn.v_proj(h).view(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        inv_freq = inverse_frequencies(c.rope, c.head_dim, x.device)
        return rotate(q, positions, inv_freq), rotate(k, positions, inv_freq), v

    def finish(self, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The layer's output given its input x and the attention output [T, heads * D]."""
        h = x + self.self_attn.o_proj(attention)
        return h + self.mlp(self.post_attention_layernorm(h))
