"""Label smoothing (Section 5.4) and the loss computation the training loop calls."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0


class LabelSmoothing(nn.Module):
    """KL divergence between the model's distribution and a label-smoothed target, summed over tokens.

    The target distribution (as the notebook defines it) puts `1 - smoothing` on the true token,
    0 on the padding token, and spreads `smoothing` evenly over the other `size - 2` tokens; rows
    whose target is padding contribute nothing.

    The divergence sum_j t_j (log t_j - x_j) is computed in closed form, without building the
    (N, V) target matrix: the entropy term is a constant, and the cross term needs only the
    true token's log-probability and the row sum of log-probabilities. Terms whose target weight
    is zero (the padding column) are left out entirely, so a log-probability of -inf there (the
    notebook's `predict.log()` of a zero) cannot turn the loss into nan, as it did upstream.
    """

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        if size < 3:
            raise ValueError(f"label smoothing needs a vocabulary of at least 3 tokens, got {size}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.size = size
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        self.fill = smoothing / (size - 2)  # weight of each token that is neither the target nor padding
        # sum_j t_j log t_j: the same for every non-padding row.
        self.entropy_term = _xlogx(self.confidence) + (size - 2) * _xlogx(self.fill)

    def smoothed_targets(self, target: Tensor) -> Tensor:
        """The explicit (N, V) target distribution (the notebook's `true_dist`), for plots and tests."""
        dist = torch.full((target.size(0), self.size), self.fill)
        dist.scatter_(1, target.unsqueeze(1).cpu(), self.confidence)
        dist[:, self.padding_idx] = 0.0
        dist[target.cpu() == self.padding_idx] = 0.0
        return dist

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        """x: log-probabilities (N, V); target: token ids (N,). Returns the summed divergence (scalar)."""
        assert x.size(1) == self.size, f"expected {self.size} classes, got {x.size(1)}"
        p = self.padding_idx
        logp_target = x.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        loss = self.entropy_term - self.confidence * logp_target  # (N,)
        if self.fill > 0:
            # Row sum over every column except padding, then remove the target's own term.
            logp_rest = x[:, :p].sum(1) + x[:, p + 1:].sum(1) - logp_target  # (N,)
            loss = loss - self.fill * logp_rest
        return loss.masked_fill(target == p, 0.0).sum()


class SimpleLossCompute:
    """Apply the generator, then the criterion; return (summed loss for logging, loss divided by `norm`).

    (`fast.FusedLossCompute` computes the same loss with the log-softmax fused in, for speed.)
    """

    def __init__(self, generator: nn.Module, criterion: nn.Module) -> None:
        self.generator = generator
        self.criterion = criterion

    def __call__(self, x: Tensor, y: Tensor, norm: float | Tensor) -> tuple[Tensor, Tensor]:
        """x: decoder output (B, T, d); y: target ids (B, T); norm: the token count to divide by."""
        logp = self.generator(x)  # (B, T, V)
        loss = self.criterion(logp.reshape(-1, logp.size(-1)), y.reshape(-1))
        return loss.detach(), loss / norm

    def loss_of_logits(self, logits: Tensor, y: Tensor) -> Tensor:
        """The criterion's summed loss on unnormalised scores: logits (N, V), y (N,) (R-Drop's two passes)."""
        return self.criterion(torch.log_softmax(logits, dim=-1), y)
