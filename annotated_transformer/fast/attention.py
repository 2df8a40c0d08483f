"""Equation 1 through PyTorch's fused kernel (`FusedAttention`), swapped in on a built model by the speed plan.

The paper's MultiHeadedAttention (attention.py) computes softmax(Q K^T / sqrt(d_k)) V step by step, as the
notebook does. F.scaled_dot_product_attention computes the same in one kernel that never writes the (T, S)
probabilities out, which pays on GPUs; on CPUs the explicit product was measured faster (docs/performance.md),
so `model.attention_kernel=auto` keeps it there (plan.py decides). The swap changes the class of each
MultiHeadedAttention in place: same parameters, same state_dict, same hooks.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ..attention import MultiHeadedAttention


class FusedAttention(MultiHeadedAttention):
    """MultiHeadedAttention whose equation 1 runs in PyTorch's fused kernel; explicit in a call where a hook needs
    the probabilities (attention maps, guided attention, token merging), which the fused kernel does not return."""

    def heads_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """q (B, h, T, d_k), k/v (B, h, S, d_k) -> (B, h, T, d_k), and the probabilities only when a hook asks."""
        if self.hooks and any(hook.needs_probs(self) for hook in self.hooks):
            return super().heads_attention(q, k, v, mask)  # (B, h, T, d_k), (B, h, T, S)
        p = self.dropout.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None  # (B, h, T, d_k)
