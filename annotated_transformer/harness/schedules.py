"""The learning-rate schedules a run can use: the paper's `rate` ("noam"), or warm-up to the same peak then
linear or cosine decay to the end of a fixed budget (train.schedule); one LambdaLR for all of them.

With `lr_on_device` (train.compile=captured) the rate lives on the device as a 0-dim tensor in each of the
optimizer's param groups, which the schedule overwrites in place every step and fused Adam reads there: a
step recorded once as a CUDA graph then reads each step's rate, not the one it was recorded with, and
setting it is a kernel launch with the rate as its argument, never a wait for the device.
"""

from __future__ import annotations

import math
from typing import Any

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


def build_scheduler(optimizer: torch.optim.Optimizer, model_size: int, factor: float, warmup: int,
                    schedule: str = "noam", total_steps: int = 0, final_ratio: float = 0.0,
                    lr_on_device: bool = False) -> LambdaLR:
    """A schedule driven through LambdaLR: call `.step()` once per optimizer step.

    'noam' is `rate`; 'linear' and 'cosine' are `budget_rate` with the same peak as `rate` (so
    `factor` and `warmup` mean the same under every schedule), decaying to the end of `total_steps`.
    The rate is a function of the step alone, so a resumed run continues it exactly. `lr_on_device`:
    the rate as a device tensor (`rate_on_device`), for a captured step.
    """
    if schedule == "noam":
        scheduler = LambdaLR(optimizer, lr_lambda=lambda step: rate(step, model_size, factor, warmup))
    elif schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    elif total_steps < 1:
        raise ValueError(f"the {schedule} schedule needs the run's total steps, got {total_steps}")
    else:
        peak = rate(warmup, model_size, factor, warmup)  # rate's highest value, at the end of its warm-up
        scheduler = LambdaLR(optimizer, lr_lambda=lambda step: budget_rate(step, total_steps, peak, warmup, schedule,
                                                                             final_ratio))
    if lr_on_device:
        rate_on_device(optimizer)
    return scheduler


def rate_on_device(optimizer: torch.optim.Optimizer) -> None:
    """Each param group's rate as a 0-dim float32 tensor on its parameters' device, from now on written in place.

    LambdaLR keeps float base rates, so each step it fills the tensor with a host float (no device read);
    float32, because CUDA's fused Adam reads a tensor rate as one. Only Adam's fused or capturable kinds take a
    tensor rate without reading it back to the host every step.
    """
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            raise ValueError("a learning rate on the device needs a fused or capturable optimizer "
                             "(optim.build_optimizer(model, fused=True))")
        device = group["params"][0].device
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)


def set_rate(group: dict[str, Any], value: float) -> None:
    """Set a param group's rate: in place where it is a device tensor (`rate_on_device`), else replaced."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value
