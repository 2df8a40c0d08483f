"""Guided attention (Tachibana et al. 2017): a loss on encoder-decoder attention far from the diagonal.

Target position t of T usually draws on source positions near t/T of the source, so attention
weight at (t, s) costs W[t, s] = 1 - exp(-(s/S - t/T)^2 / (2 g^2)), over each sentence's real
(unpadded) lengths; padding costs nothing. The penalty is sum_t sum_s A[t, s] W[t, s], summed over
a batch's real target positions like the cross-entropy it is added to, averaged over the guided
heads and layers, and weighted by lambda. German puts verbs last, so a hard diagonal would be
wrong for some words: guide a few heads, with a wide g, and let the weight decay.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..attention import MultiHeadedAttention


class ProbsForLoss:
    """An attention hook: in training, the layer's latest probabilities with their gradient, for the penalty."""

    def __init__(self) -> None:
        self.probs: Tensor | None = None  # (B, h, T, S), before dropout

    def needs_probs(self, attn: MultiHeadedAttention) -> bool:
        """In training only: evaluation and decoding keep the fused kernel."""
        return attn.training

    def __call__(self, attn: MultiHeadedAttention, keys: Tensor, probs: Tensor | None) -> None:
        self.probs = probs if attn.training else None


def guide_weights(src_len: Tensor, tgt_len: Tensor, S: int, T: int, sigma: float) -> Tensor:
    """(B,) real lengths -> W (B, T, S): 1 - exp(-(s/S_b - t/T_b)^2 / (2 sigma^2)), 0 outside the real lengths."""
    pos_s = torch.arange(S, device=src_len.device).unsqueeze(0)  # (1, S)
    pos_t = torch.arange(T, device=tgt_len.device).unsqueeze(0)  # (1, T)
    s = pos_s / src_len.unsqueeze(1).clamp(min=1)  # (B, S)
    t = pos_t / tgt_len.unsqueeze(1).clamp(min=1)  # (B, T)
    w = 1.0 - torch.exp(-(s.unsqueeze(1) - t.unsqueeze(2)) ** 2 / (2 * sigma ** 2))  # (B, T, S)
    real = (pos_t < tgt_len.unsqueeze(1)).unsqueeze(2) & (pos_s < src_len.unsqueeze(1)).unsqueeze(1)  # (B, T, S)
    return w * real


def guided_attention_penalty(probs: Tensor, weights: Tensor) -> Tensor:
    """probs (B, h, T, S) attention of the guided heads, weights (B, T, S) -> the penalty summed over
    positions, averaged over heads (a scalar, fp32)."""
    return (probs.float() * weights.unsqueeze(1)).sum() / probs.size(1)


def decayed_weight(step: int, weight: float, decay_steps: int) -> float:
    """lambda at optimizer step `step`: constant, or falling linearly to 0 over `decay_steps`."""
    if decay_steps <= 0:
        return weight
    return weight * max(0.0, 1.0 - step / decay_steps)
