"""The Llama-style decoder (Llama, Mistral, Qwen2, Qwen3): embeddings, decoder layers, final norm and LM head.

``forward_dense`` runs a whole sequence with ordinary causal attention and no cache. It is the
ground truth the paged paths (``runner.py``) are tested against, and shares every layer with them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from daemons.model.attention import attend
from daemons.model.config import ModelConfig
from daemons.model.layers import DecoderLayer, RMSNorm


class _Body(nn.Module):
    """Holds what Hugging Face keeps under ``model.``: embeddings, layers and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.requires_grad_(False)
        self.eval()

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def device(self) -> torch.device:
        """Where the weights are, and so where inputs and KV pages must be."""
        return self.lm_head.weight.device

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(token_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [T, vocab] of final hidden states [T, hidden]."""
        return self.lm_head(self.model.norm(hidden)).float()

    @torch.no_grad()
    def forward_dense(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [T, vocab] of every position, recomputing the whole sequence (no KV cache)."""
        positions = torch.arange(len(token_ids), device=self.device)
        h = self.embed(torch.tensor(token_ids, device=self.device))
        for layer in self.layers:
            q, k, v = layer.qkv(h, positions)
            h = layer.finish(h, attend(q, k, v, positions))
        return self.logits(h)


def empty_model(config: ModelConfig) -> LlamaModel:
    """A model with uninitialised weights in the config's dtype, for a loader or an initialiser to
    fill. Built on the meta device first, so nn.Linear's default initialisation neither costs time
    nor consumes the global random generator."""
    with torch.device("meta"):
        model = LlamaModel(config)
    model = model.to_empty(device="cpu").to(config.torch_dtype)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def random_model(config: ModelConfig, seed: int = 0) -> LlamaModel:
    """A model with weights drawn from ``seed`` alone (its own generator; global RNG untouched).

    Linear weights get std 1/sqrt(fan_in) and embeddings std 1, so activations stay O(1) through
    the layers and the logits are spread out: greedy choices are then far from ties and do not
    flip under float rounding differences between batch shapes. Weights are drawn in float32
    and cast, so every dtype gets the same model.
    """
    model = empty_model(config)
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if param.dim() == 1:
            param.fill_(1.0)  # norm weights start at 1, as in training
            continue
        std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(param.shape[1])
        param.copy_(torch.randn(param.shape, generator=generator) * std)
    return model
