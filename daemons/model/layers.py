"""The pieces of a Llama-style decoder layer: RMSNorm, GQA projections (with the biases and the
q/k norms some architectures add), SwiGLU; the rotary embedding is in ``rope.py``.

Module and parameter names copy Hugging Face's ``LlamaForCausalLM`` (``self_attn.q_proj``,
``self_attn.q_norm``, ``mlp.gate_proj``, ``input_layernorm`` ...), which Qwen2, Qwen3 and Mistral
share, so a checkpoint's tensor names are this model's state-dict keys and loading needs no
renaming table. Attention itself is not here: the layer
only turns hidden states into (q, k, v) and an attention output back into hidden states, so the
same layer serves the dense reference and the paged KV cache.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from daemons.model.config import ModelConfig
from daemons.model.rope import inverse_frequencies, rotate


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
