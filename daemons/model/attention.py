"""Causal grouped-query attention over keys and values of absolute positions 0..S-1.

Plain matmul + softmax rather than a fused kernel: it is deterministic on CPU, and its result
for a given (queries, keys) shape does not depend on where those keys came from (computed in this
pass, read from KV pages, or imported from the store).
"""

from __future__ import annotations

import math

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q [T, heads, D] at ``positions`` [T]; k, v [S, kv_heads, D] of positions 0..S-1 -> [T, heads*D].

    A query at position p sees keys 0..p. Query heads are grouped onto KV heads (GQA) by reshaping,
    not by copying K and V once per group.
    """
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.view(tokens, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [kvh, g, T, D]
    keys = k.permute(1, 0, 2).unsqueeze(1)  # [kvh, 1, S, D]
    values = v.permute(1, 0, 2).unsqueeze(1)
    scores = (q @ keys.transpose(-1, -2)).float() * (1.0 / math.sqrt(head_dim))  # [kvh, g, T, S]
    visible = torch.arange(k.shape[0])[None, :] <= positions[:, None]  # [T, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = probs @ values  # [kvh, g, T, D]
    return out.permute(2, 0, 1, 3).reshape(tokens, heads * head_dim)
