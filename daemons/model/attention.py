"""Attention over keys and values of absolute positions 0..S-1, with query heads grouped onto KV
heads (GQA) by reshaping, never by copying K and V once per group.

Two forms. ``attend`` (prefill and the dense reference) is causal over one sequence, in plain
matmul + softmax: deterministic on CPU, and its result for a given (queries, keys) shape does not
depend on where those keys came from (computed in this pass, read from KV pages, or imported from
the store), which is what makes stored KV reusable bit for bit. ``attend_padded`` (decode) takes
one query per sequence for a whole batch, keys padded to a common length and a mask of each
sequence's own length, in one fused ``scaled_dot_product_attention`` call: decode KV is never
stored under a prefix key, so it needs speed rather than that promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q [T, heads, D] at ``positions`` [T]; k, v [S, kv_heads, D] of positions 0..S-1 -> [T, heads*D].

    A query at position p sees keys 0..p.
    """
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.view(tokens, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [kvh, g, T, D]
    keys = k.permute(1, 0, 2).unsqueeze(1)  # [kvh, 1, S, D]
    values = v.permute(1, 0, 2).unsqueeze(1)
    scores = (q @ keys.transpose(-1, -2)).float() * (1.0 / math.sqrt(head_dim))  # [kvh, g, T, S]
    visible = torch.arange(k.shape[0], device=k.device)[None, :] <= positions[:, None]  # [T, S]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = probs @ values  # [kvh, g, T, D]
    return out.permute(2, 0, 1, 3).reshape(tokens, heads * head_dim)


@dataclass(frozen=True)
class KeyMask:
    """Which of a batch's B x S padded key positions are a sequence's own: built once per decode
    step from the lengths and shared by every layer."""

    bias: torch.Tensor  # [B, 1, 1, S]: 0 where visible, -inf elsewhere; added to the scores
    padding: torch.Tensor  # flat indices into B*S of the positions that are not visible

    @classmethod
    def of_lengths(cls, lengths: torch.Tensor, width: int, dtype: torch.dtype) -> KeyMask:
        """Sequence b sees positions 0..lengths[b]-1 of ``width`` (at least max(lengths)), on
        the device of ``lengths``.

        An additive mask in the queries' dtype rather than a boolean one, which the attention
        call would otherwise convert into one in every layer.
        """
        hidden = torch.arange(width, device=lengths.device)[None, :] >= lengths[:, None]
        bias = torch.zeros(hidden.shape, dtype=dtype, device=lengths.device).masked_fill_(hidden, float("-inf"))
        return cls(bias[:, None, None, :], hidden.reshape(-1).nonzero().squeeze(1))


def attend_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: KeyMask) -> torch.Tensor:
    """q [B, heads, D], each sequence's one new token; k, v [B, S, kv_heads, D] of positions
    0..S-1, padded past each sequence's length -> [B, heads*D].

    ``k`` and ``v`` are overwritten with zeros at the padding. Padded positions read whatever a
    page held before (another request's KV, foreign bytes); the mask gives them probability 0,
    but a NaN or inf there would still poison the row (NaN - inf is NaN, 0 * NaN is NaN).
    """
    batch, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    for gathered in (k, v):
        gathered.view(-1, kv_heads * head_dim).index_fill_(0, mask.padding, 0)
    # The queries of one KV head's group are the rows of one [group, D] matrix.
    grouped = q.view(batch, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(grouped, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask.bias)
    return out.reshape(batch, heads * head_dim)
