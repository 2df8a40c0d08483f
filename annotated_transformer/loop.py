"""The training loop, as the notebook has it: `TrainState`, one `train_step`, and `run_epoch`.

Loss normalisation: a step's loss is the sum of the per-token losses of its `accum_iter` micro-batches
on every rank, divided by their total number of non-padding target tokens, so the gradient is that of
one big batch however the tokens are split. Every rank knows that total (all follow one batch plan,
`data.loader`) and divides by (global tokens / world size), because DDP averages gradients over ranks.
The harness runs the same `train_step` in its own loop (`harness.train_loop`: logs, resuming, ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from itertools import islice
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .data.batch import Batch
from .runtime.precision import amp_context
from .loss import SimpleLossCompute

Log = Callable[[str], None]
# (model, batch, loss_compute, norm, step) -> (summed loss, loss / norm): a training loss other than teacher forcing
Objective = Callable[[nn.Module, Batch, SimpleLossCompute, float, int], tuple[Tensor, Tensor]]


@dataclass
class TrainState:
    """Counters that say how far training got; saved in every checkpoint.

    The notebook counted batches in `step` and optimizer updates in `accum_step`. Here `step`
    is the optimizer update (what the learning-rate schedule, the logs and `train.max_steps`
    count) and `micro_step` counts batches; with no accumulation they are equal. A run's epochs,
    clocks and best score are the harness's (`harness.resume.RunCounters`).
    """

    step: int = 0  # optimizer updates taken
    micro_step: int = 0  # batches (micro-batches) processed
    samples: int = 0  # sentences processed (this rank)
    tokens: int = 0  # non-padding target tokens processed (this rank)

    def state_dict(self) -> dict[str, Any]:
        """A plain dict for checkpoints."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` output; other keys beside these (the harness's counters) are left alone."""
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, state[f.name])


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and/or torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def step_norm(group: list[Batch], ws: int) -> float:
    """What this rank divides its summed loss by: global non-padding target tokens / world size (host ints)."""
    if ws == 1:
        return float(max(sum(b.ntokens for b in group), 1))
    if any(b.global_ntokens is None for b in group):
        raise ValueError("under torchrun each training batch needs global_ntokens (set by the training loaders)")
    return max(sum(b.global_ntokens for b in group), 1) / ws


def train_step(group: list[Batch], model: nn.Module, loss_compute: SimpleLossCompute,
               optimizer: torch.optim.Optimizer, scheduler: Any, *, amp_dtype: torch.dtype | None = None,
               clip_grad_norm: float = 0.0, ws: int = 1, objective: Objective | None = None,
               step: int = 0) -> tuple[Tensor, Tensor | None]:
    """One optimizer step over the micro-batches of `group` (already on the device).

    Forward and backward of each micro-batch (DDP all-reduces only after the last), optional
    clipping, the optimizer and the schedule. Returns the summed loss and the gradient norm
    (when clipping) as device tensors: nothing here waits for the device. An `objective`
    (an extension of kind objective) replaces the teacher-forced forward and loss; `step` is its clock.
    """
    norm = step_norm(group, ws)
    device = group[0].src.device
    loss_sum: Tensor | None = None
    for i, batch in enumerate(group):
        sync = model.no_sync() if isinstance(model, DDP) and i < len(group) - 1 else nullcontext()
        with sync:
            with amp_context(device, amp_dtype):
                if objective is None:
                    out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
                    batch_loss, loss = loss_compute(out, batch.tgt_y, norm)
                else:
                    batch_loss, loss = objective(model, batch, loss_compute, norm, step)
            loss.backward()
        loss_sum = batch_loss if loss_sum is None else loss_sum + batch_loss
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm) if clip_grad_norm > 0 else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return loss_sum, grad_norm


def batch_groups(data_iter: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """Consecutive lists of `size` batches (the last may be shorter), drawn only when asked for."""
    it = iter(data_iter)
    while group := list(islice(it, size)):
        yield group


def run_epoch(data_iter: Iterable[Batch], model: nn.Module, loss_compute: SimpleLossCompute,
              optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None, mode: str = "train",
              accum_iter: int = 1, train_state: TrainState | None = None, log_every: int = 40,
              log: Log | None = print) -> tuple[float, TrainState]:
    """One pass over `data_iter`: a `train_step` every `accum_iter` batches, or (mode='eval') the loss alone.

    Returns (mean loss per target token, state). The loss is summed on the device and read at the end
    and on the log lines (every `log_every` steps, as the notebook prints every 40 batches).
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    if mode == "train" and (optimizer is None or scheduler is None):
        raise ValueError("training needs an optimizer and a scheduler")
    state = train_state if train_state is not None else TrainState()
    device = next(model.parameters()).device
    model.train(mode == "train")
    total, tokens, window, start = torch.zeros((), device=device), 0, 0, time.perf_counter()
    for group in batch_groups(data_iter, accum_iter if mode == "train" else 1):
        group = [b.to(device) for b in group]
        n = sum(b.ntokens for b in group)
        if mode == "train":
            loss_sum, _ = train_step(group, model, loss_compute, optimizer, scheduler)
            state.step, state.micro_step = state.step + 1, state.micro_step + len(group)
            state.samples, state.tokens = state.samples + sum(len(b) for b in group), state.tokens + n
        else:
            with torch.no_grad():
                b = group[0]
                loss_sum = loss_compute(model(b.src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, 1.0)[0]
        total, tokens, window = total + loss_sum, tokens + n, window + n
        if mode == "train" and log is not None and state.step % log_every == 1:
            elapsed, lr = time.perf_counter() - start, optimizer.param_groups[0]["lr"]
            log(f"step {state.step:6d} | loss {loss_sum.item() / n:6.2f} | {window / elapsed:7.1f} tokens/s | "
                f"lr {lr:6.1e}")
            window, start = 0, time.perf_counter()
    return (total / max(tokens, 1)).item(), state
