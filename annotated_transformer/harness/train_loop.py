"""The harness's loop around the core's `train_step`: an epoch with logs, stops, resuming and ranks.

`loop.run_epoch` is the notebook's loop; this one is what a real run needs on top of it. The loss is summed
on the device and read once per log interval over all ranks (`LossMeter`), where a non-finite value stops
the run (`TrainingDiverged`); the caller's log, progress bar, work between steps (validation and checkpoints
every N steps) and stop signal come in one `LoopHooks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..data.batch import Batch
from ..runtime.precision import amp_context
from ..loop import Log, Objective, TrainState, batch_groups, train_step
from ..loss import SimpleLossCompute
from .loss_meter import LossMeter, diverged, log_window, world_size


@dataclass
class LoopHooks:
    """What the loop tells its caller, and asks of it."""

    log: Log | None = print  # a line every log_every steps (None: no lines)
    on_log: Callable[[dict[str, float]], None] | None = None  # the same figures as a dict (the metrics file)
    after_step: Callable[[], None] | None = None  # called after every step (and its log line), before should_stop
    should_stop: Callable[[], bool] | None = None  # asked after every step: a signal came, the run must stop
    progress: Any = None  # a tqdm-like bar, advanced once per step


def train_loop(data_iter: Iterable[Batch], model: nn.Module, loss_compute: SimpleLossCompute,
               optimizer: torch.optim.Optimizer, scheduler: Any, state: TrainState, *, accum_iter: int = 1,
               device: torch.device | str | None = None, amp_dtype: torch.dtype | None = None,
               clip_grad_norm: float = 0.0, max_steps: int = 0, log_every: int = 50, hooks: LoopHooks | None = None,
               meter: LossMeter | None = None, objective: Objective | None = None, epoch: int = 0) -> float:
    """One epoch of `train_step`s over `data_iter` (`accum_iter` micro-batches each); the mean loss per token.

    Every `log_every` steps the window's loss, tokens/s and learning rate go to the hooks, and a
    non-finite loss raises `TrainingDiverged`; `max_steps` > 0 stops when `state.step` reaches it;
    `meter` carries the loss sums of an epoch resumed mid-way; `objective` replaces the teacher-forced
    loss (see `train_step`); `epoch` (from 0) is named in the divergence error. The loss is summed over ranks and
    divided by the tokens of all ranks.
    """
    hooks = hooks if hooks is not None else LoopHooks()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    meter = meter if meter is not None else LossMeter(device)
    model.train()
    ws = world_size()
    for group in batch_groups(data_iter, accum_iter):
        group = [b.to(device, non_blocking=True) for b in group]
        loss_sum, grad_norm = train_step(group, model, loss_compute, optimizer, scheduler, amp_dtype=amp_dtype,
                                         clip_grad_norm=clip_grad_norm, ws=ws, objective=objective, step=state.step)
        tokens = sum(b.ntokens for b in group)
        meter.add(loss_sum, tokens, grad_norm)
        state.step += 1
        state.micro_step += len(group)
        state.samples += sum(len(b) for b in group)
        state.tokens += tokens
        if hooks.progress is not None:
            hooks.progress.update(1)
        if state.step % log_every == 0:
            log_window(meter, state, optimizer, hooks.log, hooks.on_log, hooks.progress, log_every, epoch)
        if hooks.after_step is not None:
            hooks.after_step()
        if (max_steps and state.step >= max_steps) or (hooks.should_stop is not None and hooks.should_stop()):
            break
    loss = meter.read_epoch()
    if not math.isfinite(loss):
        raise diverged(state, epoch, "the epoch's loss", loss, state.step - state.step % log_every)
    return loss


@torch.no_grad()
def evaluate_loss(data_iter: Iterable[Batch], model: nn.Module, loss_compute: SimpleLossCompute, *,
                  device: torch.device | str | None = None, amp_dtype: torch.dtype | None = None) -> float:
    """Mean loss per token over `data_iter` in eval mode (no dropout, no gradients), summed over ranks."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    meter = LossMeter(device)
    model.eval()
    for batch in data_iter:
        batch = batch.to(device, non_blocking=True)
        with amp_context(device, amp_dtype):
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
            meter.add(loss_compute(out, batch.tgt_y, 1.0)[0], batch.ntokens)
    return meter.read_epoch()
