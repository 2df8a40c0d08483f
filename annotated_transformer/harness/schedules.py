"""The learning-rate schedules a run can use: the paper's `rate` ("noam"), or warm-up to the same peak then
linear or cosine decay to the end of a fixed budget (train.schedule); one LambdaLR for all of them."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from ..optim import rate


SCHEDULES = ("noam", "linear", "cosine")


def budget_rate(step: int, total_steps: int, peak: float, warmup: int, shape: str = "cosine",
                final_ratio: float = 0.0) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then linear or cosine decay to `final_ratio * peak`
    at `total_steps` (and held there after it); step 0 counts as 1, as in `rate`.

    A run of known length ends annealed: the last updates take small steps around the weights it
    found, instead of stopping at the inverse-square-root schedule's still-large rate.
    """
    step = max(step, 1)
    if step <= warmup:
        return peak * step / warmup
    progress = min((step - warmup) / max(total_steps - warmup, 1), 1.0)  # 0 after warm-up, 1 at the end
    left = 1.0 - progress if shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * (final_ratio + (1.0 - final_ratio) * left)


def peak_rate(model_size: int, factor: float, warmup: int) -> float:
    """The highest rate `rate` reaches (at step `warmup`): factor * d_model^-0.5 * warmup^-0.5."""
    return rate(warmup, model_size, factor, warmup)


def build_scheduler(optimizer: torch.optim.Optimizer, model_size: int, factor: float, warmup: int,
                    schedule: str = "noam", total_steps: int = 0, final_ratio: float = 0.0) -> LambdaLR:
    """A schedule driven through LambdaLR: call `.step()` once per optimizer step.

    'noam' is `rate`; 'linear' and 'cosine' are `budget_rate` with the same peak as `rate` (so
    `factor` and `warmup` mean the same under every schedule), decaying to the end of `total_steps`.
    The rate is a function of the step alone, so a resumed run continues it exactly.
    """
    if schedule == "noam":
        return LambdaLR(optimizer, lr_lambda=lambda step: rate(step, model_size, factor, warmup))
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    if total_steps < 1:
        raise ValueError(f"the {schedule} schedule needs the run's total steps, got {total_steps}")
    peak = peak_rate(model_size, factor, warmup)
    return LambdaLR(optimizer, lr_lambda=lambda step: budget_rate(step, total_steps, peak, warmup, schedule,
                                                                    final_ratio))
