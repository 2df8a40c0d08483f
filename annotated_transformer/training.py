"""The training core: `TrainState` and `run_epoch`.

Loss normalisation: a training step may span `accum_iter` micro-batches on each of
`world_size` ranks. Its loss is the sum of the per-token losses of all of them divided by
their total number of non-padding target tokens, so the gradient is exactly the gradient of
one big batch, however the tokens are split between micro-batches and ranks. Each rank
divides its summed micro-batch loss by (global tokens / world_size) because DDP averages
gradients over ranks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .data.batch import Batch
from .distributed import all_reduce_sum, world_size
from .loss import SimpleLossCompute


@dataclass
class TrainState:
    """Counters that say how far training got; saved in every checkpoint.

    The notebook counted batches in `step` and optimizer updates in `accum_step`. Here `step`
    is the optimizer update (what the learning-rate schedule, the logs and `train.max_steps`
    count) and `micro_step` counts batches; with no accumulation they are equal.
    """

    step: int = 0  # optimizer updates taken
    micro_step: int = 0  # batches (micro-batches) processed
    samples: int = 0  # sentences processed (this rank)
    tokens: int = 0  # non-padding target tokens processed (this rank)
    epoch: int = 0  # epochs completed
    best_metric: float | None = None  # best validation score so far (BLEU or loss)
    best_epoch: int = 0  # the epoch that scored it

    def state_dict(self) -> dict[str, Any]:
        """A plain dict for checkpoints."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` output."""
        for key, value in state.items():
            setattr(self, key, value)


def amp_context(device: torch.device, dtype: torch.dtype | None):
    """bf16/fp16 autocast on `device`, or a no-op for full precision."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _lr(optimizer: torch.optim.Optimizer | None) -> float:
    return optimizer.param_groups[0]["lr"] if optimizer is not None else 0.0


def run_epoch(
    data_iter: Iterable[Batch],
    model: nn.Module,
    loss_compute: SimpleLossCompute,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    mode: str = "train",
    accum_iter: int = 1,
    train_state: TrainState | None = None,
    *,
    device: torch.device | str | None = None,
    amp_dtype: torch.dtype | None = None,
    clip_grad_norm: float = 0.0,
    max_steps: int = 0,
    log_every: int = 50,
    log: Callable[[str], None] | None = print,
    on_log: Callable[[dict[str, float]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Any = None,
) -> tuple[float, TrainState]:
    """Train (mode='train') or evaluate (mode='eval') over `data_iter`; return (mean loss per token, state).

    Training groups `accum_iter` micro-batches into one optimizer step and steps the scheduler
    once per optimizer step. The returned loss is summed over ranks, divided by the tokens of
    all ranks. `log` gets a line with step, loss, tokens/s and learning rate every `log_every`
    steps; `on_log` gets the same figures as a dict. `should_stop` is asked after every
    optimizer step (e.g. a signal arrived); `max_steps` > 0 stops when `train_state.step` reaches it.
    `progress` (a tqdm bar) is advanced once per step.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    training = mode == "train"
    if training and (optimizer is None or scheduler is None):
        raise ValueError("training needs an optimizer and a scheduler")
    state = train_state if train_state is not None else TrainState()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    ws = world_size()
    is_ddp = isinstance(model, DDP)
    model.train(training)

    total_loss = torch.zeros((), device=device)  # summed loss, kept on the device: no sync per step
    total_tokens = 0
    window_loss = torch.zeros((), device=device)
    window_tokens, window_time = 0, time.perf_counter()
    it = iter(data_iter)
    group_size = accum_iter if training else 1
    grad_ctx = nullcontext() if training else torch.no_grad()
    with grad_ctx:
        while True:
            if training and max_steps and state.step >= max_steps:
                break
            group = list(islice(it, group_size))
            if not group:
                break
            group = [b.to(device, non_blocking=True) for b in group]
            n_tokens = sum(b.ntokens for b in group)
            norm: float | torch.Tensor = max(n_tokens, 1)
            if training and ws > 1:
                # Divide by the global token count over ranks (see module docstring).
                norm = all_reduce_sum(torch.tensor(float(n_tokens), device=device)).clamp_min(1.0) / ws
            for i, batch in enumerate(group):
                sync = model.no_sync() if (training and is_ddp and i < len(group) - 1) else nullcontext()
                with sync:
                    with amp_context(device, amp_dtype):
                        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
                        loss_sum, loss = loss_compute(out, batch.tgt_y, norm)
                    if training:
                        loss.backward()
                total_loss += loss_sum
                window_loss += loss_sum
            total_tokens += n_tokens
            window_tokens += n_tokens
            state.micro_step += len(group)
            state.samples += sum(len(b) for b in group)
            state.tokens += n_tokens
            if not training:
                continue

            if clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            state.step += 1
            if progress is not None:
                progress.update(1)

            if state.step % log_every == 0:
                stats = all_reduce_sum(torch.stack([window_loss, torch.tensor(float(window_tokens), device=device)]))
                elapsed = time.perf_counter() - window_time
                w_loss, w_tokens = (float(v) for v in stats.tolist())
                figures = {"step": state.step, "loss": w_loss / max(w_tokens, 1.0),
                           "tokens_per_s": w_tokens / max(elapsed, 1e-9), "lr": _lr(optimizer)}
                if log is not None:
                    log(f"step {figures['step']:6d} | loss {figures['loss']:7.4f} | "
                        f"{figures['tokens_per_s']:9.0f} tok/s | lr {figures['lr']:.3e}")
                if progress is not None:
                    progress.set_postfix(loss=f"{figures['loss']:.3f}", tok_s=f"{figures['tokens_per_s']:.0f}",
                                         lr=f"{figures['lr']:.2e}")
                if on_log is not None:
                    on_log(figures)
                window_loss.zero_()
                window_tokens, window_time = 0, time.perf_counter()
            if should_stop is not None and should_stop():
                break

    stats = all_reduce_sum(torch.stack([total_loss.float(), torch.tensor(float(total_tokens), device=device)]))
    loss_sum, tokens = (float(v) for v in stats.tolist())
    return (loss_sum / tokens if tokens else math.nan), state
