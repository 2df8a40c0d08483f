"""Attention (Section 3.2): the scaled dot product of equation 1 and multi-head attention.

Shapes: B batch, T queries, S keys, d = d_model, h heads, d_k = d / h. Masks are boolean with
True = "may attend", or a float bias added to the scores. `MultiHeadedAttention` computes equation 1
explicitly (`attention`), as the notebook does; its `hooks` are the one place where attention maps and
the extensions see inside attention. (Where PyTorch's fused kernel pays, the speed plan swaps it in
from outside: fast/attention.py.)
"""

from __future__ import annotations

import copy
import math
from typing import Protocol

import torch
from torch import Tensor, nn


def attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout: nn.Dropout | None = None
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V (the paper's equation 1), explicitly.

    query (..., T, d_k), key/value (..., S, d_k), mask broadcastable to (..., T, S).
    Returns the output (..., T, d_k) and the attention probabilities (..., T, S) before dropout
    (the notebook returned them after; in eval mode, where maps are drawn, the two are equal).
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T, S)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    elif mask is not None:
        # The most negative finite value, not -inf: a row with nothing to attend to stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    p_attn = scores.softmax(dim=-1)  # (..., T, S)
    p_used = dropout(p_attn) if dropout is not None else p_attn
    return p_used @ value, p_attn  # (..., T, d_k), (..., T, S)


class AttentionHook(Protocol):
    """What a MultiHeadedAttention calls after each attention, for every hook in its `hooks` list."""

    def needs_probs(self, attn: MultiHeadedAttention) -> bool:
        """True: this call needs the probabilities (a fused kernel then computes equation 1 explicitly)."""

    def __call__(self, attn: MultiHeadedAttention, keys: Tensor, probs: Tensor | None) -> None:
        """keys (B, h, S, d_k); probs (B, h, T, S) before dropout, with their gradient (None from a fused kernel)."""


class MultiHeadedAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""

    def __init__(self, h: int, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        assert d_model % h == 0, "d_model must be divisible by h"
        self.d_k = d_model // h
        self.h = h
        linear = nn.Linear(d_model, d_model)
        self.linears = nn.ModuleList(copy.deepcopy(linear) for _ in range(4))  # W^Q, W^K, W^V, W^O (clones)
        self.dropout = nn.Dropout(p=dropout)
        self.attn: Tensor | None = None  # the notebook's: the latest probabilities, when a hook keeps them
        self.hooks: list[AttentionHook] = []

    def _heads(self, x: Tensor, linear: nn.Module) -> Tensor:
        y = linear(x)  # (B, L, d)
        return y.view(y.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        """query (B, T, d), key/value (B, S, d), mask (B, 1 or T, S) -> (B, T, d)."""
        k = self._heads(key, self.linears[1])  # (B, h, S, d_k)
        v = self._heads(value, self.linears[2])  # (B, h, S, d_k)
        return self.attend(query, k, v, mask)  # (B, T, d)

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """query (B, T, d) against projected keys/values k, v (B, h, S, d_k) -> (B, T, d): W^Q, equation 1 in
        every head, the heads concatenated, W^O."""
        q = self._heads(query, self.linears[0])  # (B, h, T, d_k)
        if mask is not None:
            mask = mask.unsqueeze(1)  # (B, 1, T or 1, S): same mask for every head
            if mask.dtype != torch.bool:
                mask = mask.to(q.dtype)  # a float bias must match the (autocast) scores
        x, probs = self.heads_attention(q, k, v, mask)  # (B, h, T, d_k), (B, h, T, S)
        for hook in self.hooks:
            hook(self, k, probs)
        return self.linears[3](x.transpose(1, 2).reshape(q.size(0), -1, self.h * self.d_k))  # (B, T, d)

    def heads_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Equation 1 in every head: q (B, h, T, d_k), k/v (B, h, S, d_k) -> (B, h, T, d_k) and the probabilities."""
        return attention(q, k, v, mask=mask, dropout=self.dropout)
