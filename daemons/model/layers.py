"""The pieces of a Llama decoder layer: RMSNorm, rotary embeddings, GQA projections, SwiGLU.

Module and parameter names copy Hugging Face's ``LlamaForCausalLM`` (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm`` ...), so a checkpoint's tensor names are this model's
state-dict keys and loading needs no renaming table. Attention itself is not here: the layer
only turns hidden states into (q, k, v) and an attention output back into hidden states, so the
same layer serves the dense reference and the paged KV cache.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from daemons.model.config import ModelConfig


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


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x`` [tokens, heads, head_dim] at absolute ``positions`` [tokens].

    Uses the half-split ("rotate_half") convention of Hugging Face Llama checkpoints, whose
    q_proj/k_proj rows are permuted for it. Angles are computed from the absolute position, so a
    token's rotated key is the same whether its block was computed now or loaded from the store.
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None, :].to(x.dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1)[:, None, :].to(x.dtype)
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated_half * sin


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

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
        return rotate(q, positions, c.rope_theta), rotate(k, positions, c.rope_theta), v

    def finish(self, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The layer's output given its input x and the attention output [T, heads * D]."""
        h = x + self.self_attn.o_proj(attention)
        return h + self.mlp(self.post_attention_layernorm(h))
