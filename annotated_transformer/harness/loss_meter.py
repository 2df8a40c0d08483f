"""The training loss as the loop reports it: summed on the device, read once per log interval, over all ranks.

No host synchronisation per step: losses (and gradient norms) are summed on the device and read
once per log interval (`LossMeter`), where a non-finite value stops the run (`TrainingDiverged`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..runtime.errors import TrainingDiverged
from ..loop import Log, TrainState
from .distributed import is_main_process


def world_size() -> int:
    """Number of processes in the job (1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum a tensor over ranks in place (no-op when not distributed); returns it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


class LossMeter:
    """Summed token losses of the epoch and of the current log window, kept on the device.

    Adding costs no host synchronisation; `read_window` and `read_epoch` sum over ranks and
    bring the figures to the host (one sync per log interval). A NaN or inf loss (or gradient
    norm, when clipping) poisons the sums it enters, so the reads also say whether every step
    since the last read was finite.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.epoch_loss = torch.zeros((), device=self.device)  # summed per-token losses of the epoch (this rank)
        self.window_loss = torch.zeros((), device=self.device)  # the same since the last log line
        self.window_grad_norm = torch.zeros((), device=self.device)  # summed gradient norms since the last log line
        self.epoch_tokens = self.window_tokens = 0  # non-padding target tokens (host ints, this rank)
        # Tokens since `window_time` in this process: a resumed window's earlier tokens ran in another one.
        self.start_clock()

    def add(self, loss_sum: Tensor, tokens: int, grad_norm: Tensor | None = None) -> None:
        """Count one batch's (or step's) summed loss and tokens; device additions only."""
        self.epoch_loss += loss_sum
        self.window_loss += loss_sum
        if grad_norm is not None:
            self.window_grad_norm += grad_norm
        self.epoch_tokens += tokens
        self.window_tokens += tokens
        self.timed_tokens += tokens

    def start_clock(self) -> None:
        """Time the window from now: a meter loaded from last.pt was made before the resumed run's set-up."""
        self.timed_tokens: int = 0
        self.window_time = time.perf_counter()

    def read_window(self) -> dict[str, float]:
        """Loss per token, tokens/s and finiteness of the window over all ranks; starts a new window."""
        loss, grad_norm, tokens, timed = self._over_ranks(self.window_loss, self.window_grad_norm,
                                                          self.window_tokens, self.timed_tokens)
        elapsed = time.perf_counter() - self.window_time
        self.window_loss.zero_()
        self.window_grad_norm.zero_()
        self.window_tokens = 0
        self.start_clock()
        return {"loss": loss / max(tokens, 1.0), "tokens_per_s": timed / max(elapsed, 1e-9),
                "finite": math.isfinite(loss) and math.isfinite(grad_norm)}

    def read_epoch(self) -> float:
        """Loss per token of the epoch so far over all ranks (nan when no tokens)."""
        loss, tokens = self._over_ranks(self.epoch_loss, self.epoch_tokens)
        return loss / tokens if tokens else math.nan

    def _over_ranks(self, *values: Tensor | int) -> list[float]:
        """Device sums and host counts, summed over ranks in one all-reduce and brought to the host (one sync)."""
        stats = torch.stack([v.float() if isinstance(v, Tensor) else torch.tensor(float(v), device=self.device)
                             for v in values])
        return all_reduce_sum(stats).tolist()

    def state_dict(self) -> dict[str, float]:
        """The sums over every rank as plain numbers (under torchrun two collectives; a host sync), so a resumed
        epoch reports the whole epoch's loss. The token counts stay exact integers."""
        losses = self._over_ranks(self.epoch_loss, self.window_loss, self.window_grad_norm)
        counts = torch.tensor([self.epoch_tokens, self.window_tokens], dtype=torch.int64, device=self.device)
        epoch_tokens, window_tokens = all_reduce_sum(counts).tolist()
        return {"epoch_loss": losses[0], "epoch_tokens": epoch_tokens, "window_loss": losses[1],
                "window_grad_norm": losses[2], "window_tokens": window_tokens, "ranks": world_size()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue from `state_dict()` output: rank 0 holds the saved sums of every rank, the others start from
        zero (the reads sum over ranks). A file without "ranks" holds rank 0's sums alone: every rank takes them."""
        share = 1.0 if is_main_process() or "ranks" not in state else 0.0
        for name in ("epoch_loss", "window_loss", "window_grad_norm"):
            getattr(self, name).fill_(state[name] * share)
        self.epoch_tokens = int(state["epoch_tokens"] * share)
        self.window_tokens = int(state["window_tokens"] * share)


def log_window(meter: LossMeter, state: TrainState, optimizer: torch.optim.Optimizer, log: Log | None,
                on_log: Callable[[dict[str, float]], None] | None, progress: Any, log_every: int,
                epoch: int = 0) -> None:
    """Read the window's figures (one sync), stop on a non-finite loss (in `epoch`, from 0), report them."""
    window = meter.read_window()
    if not window.pop("finite"):
        raise diverged(state, epoch, "the loss or the gradient norm", window["loss"], state.step - log_every)
    figures = {"step": state.step, **window, "lr": float(optimizer.param_groups[0]["lr"])}  # a float or a device tensor
    if log is not None:
        log(f"step {state.step:6d} | loss {figures['loss']:7.4f} | {figures['tokens_per_s']:9.0f} tok/s | "
            f"lr {figures['lr']:.3e}")
    if progress is not None:
        progress.set_postfix(loss=f"{figures['loss']:.3f}", tok_s=f"{figures['tokens_per_s']:.0f}",
                             lr=f"{figures['lr']:.2e}")
    if on_log is not None:
        on_log(figures)


def diverged(state: TrainState, epoch: int, what: str, value: float, after_step: int) -> TrainingDiverged:
    """The error for a value that stopped being finite: which value, between which steps of `epoch` (from 0), and
    what to change."""
    return TrainingDiverged(
        f"training diverged: {what} became {value} between steps {after_step + 1} and {state.step} "
        f"(epoch {epoch + 1}); nothing was saved from these weights. Lower train.lr_factor or set "
        "train.clip_grad_norm (e.g. 1.0)")


def weights_finite(model: nn.Module) -> bool:
    """True when every parameter is finite (one host sync)."""
    return bool(torch.stack([p.detach().isfinite().all() for p in model.parameters()]).all())
