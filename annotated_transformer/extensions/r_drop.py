"""R-Drop (Liang et al. 2021): each batch through the model twice, and a penalty when the passes disagree.

Dropout makes two passes over the same batch two different sub-networks. R-Drop trains on both
(the mean of their label-smoothed losses) and adds alpha x the symmetric KL divergence between their
token distributions, (KL(p1 || p2) + KL(p2 || p1)) / 4 per target token: the weighting of the
authors' fairseq criterion (its loss sums both passes and halves the KL sum, over twice the tokens),
so alpha means what it means there (5 for their IWSLT translation runs). The two passes run as one
batch of twice the rows, so a step costs about twice the compute of a plain one.

`train_step` calls `RDropObjective(model, batch, loss_compute, norm, step)` instead of its own
forward when `r_drop.alpha` > 0 (`build_r_drop` returns None otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.batch import Batch
from ..loss import SimpleLossCompute
from ..sections import CoreConfig, Extension, not_negative, param


@dataclass
class RDropConfig:
    """R-Drop (extensions/r_drop.py): two dropout passes per batch and a symmetric KL between them; off by default."""

    alpha: float = param(0.0, "weight of the symmetric KL divergence between the two passes' token distributions "
                         "(Liang et al. 2021; 0: off, one pass). A step costs about twice the compute")


def symmetric_kl(logits1: Tensor, logits2: Tensor, keep: Tensor) -> Tensor:
    """sum over kept rows of KL(p1 || p2) + KL(p2 || p1), in fp32; logits (N, V), keep (N,) bool."""
    logp1 = logits1.float().log_softmax(-1)  # (N, V)
    logp2 = logits2.float().log_softmax(-1)  # (N, V)
    # KL(p1||p2) + KL(p2||p1) = sum_j (p1_j - p2_j)(log p1_j - log p2_j)
    per_row = ((logp1.exp() - logp2.exp()) * (logp1 - logp2)).sum(-1)  # (N,)
    return torch.where(keep, per_row, 0.0).sum()


class RDropObjective:
    """Loss of one training micro-batch under R-Drop: (summed loss for logging, loss divided by `norm`)."""

    compute_factor = 2.0  # model FLOPs of a step relative to a plain one: every row runs twice

    def __init__(self, alpha: float, pad: int) -> None:
        self.alpha, self.pad = alpha, pad
        self.last_kl: Tensor | None = None  # the latest symmetric KL per target token (for logs and tests)

    def __call__(self, model: nn.Module, batch: Batch, loss_compute: SimpleLossCompute, norm: float,
                 step: int) -> tuple[Tensor, Tensor]:
        """Both passes as one doubled batch; the mean cross-entropy of the two, plus the weighted divergence."""
        B = batch.src.size(0)
        twice = [torch.cat([t, t]) for t in (batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)]
        out = model(*twice)  # (2B, T, d): each half with its own dropout draws
        logits = loss_compute.generator.logits(out)  # (2B, T, V)
        V = logits.size(-1)
        y = batch.tgt_y.reshape(-1)  # (B*T,)
        both = loss_compute.loss_of_logits(logits.reshape(-1, V), torch.cat([y, y]))
        ce = both / 2  # the mean of the two passes' summed losses: comparable with a plain step's loss
        kl = symmetric_kl(logits[:B].reshape(-1, V), logits[B:].reshape(-1, V), y != self.pad)
        self.last_kl = kl.detach() / (y != self.pad).sum().clamp(min=1)
        return ce.detach(), (ce + self.alpha * kl / 4) / norm

    def figures(self) -> dict[str, float]:
        """What the log records: the symmetric KL per target token of the latest step."""
        return {} if self.last_kl is None else {"rdrop_kl": self.last_kl.item()}


def build_r_drop(alpha: float, pad: int) -> RDropObjective | None:
    """The R-Drop objective, or None when the switch is off (the plain teacher-forced step)."""
    return RDropObjective(alpha, pad) if alpha > 0 else None


def validate(cfg: CoreConfig) -> None:
    """The r_drop section's rule."""
    not_negative({"r_drop.alpha": cfg.r_drop.alpha}, " (0: off)")


EXTENSION = Extension(
    name="r_drop", section=RDropConfig, help="R-Drop", order=60, kind="objective",
    on=lambda section: bool(section.alpha),
    install=lambda cfg, model, pad, objective: build_r_drop(cfg.r_drop.alpha, pad),
    validate=validate, arms={"R-Drop alpha=5": ("r_drop.alpha=5",)},
)
