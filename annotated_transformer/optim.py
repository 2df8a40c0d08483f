"""The optimizer (Section 5.3): Adam with the paper's betas, and `rate`, its learning-rate schedule ("Noam").
The schedules that decay to the end of a fixed budget, and the scheduler, are harness/schedules.py."""

from __future__ import annotations

import torch
from torch import nn


def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); step 0 counts as 1.

    Linear warm-up for `warmup` steps, then decay with the inverse square root of the step.
    """
    if step == 0:  # LambdaLR asks for step 0 first; 0^-0.5 would be infinite
        step = 1
    return factor * (model_size ** (-0.5) * min(step ** (-0.5), step * warmup ** (-1.5)))


def build_optimizer(model: nn.Module, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9,
                    fused: bool = False) -> torch.optim.Adam:
    """Adam with the paper's betas (0.9, 0.98) and eps 1e-9; base lr 1.0, scaled by the schedule.

    `fused=True` runs PyTorch's one-kernel Adam (what training's speed plan installs: `fast.fused_adam`).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=1.0, betas=tuple(betas), eps=eps, fused=fused or None)
