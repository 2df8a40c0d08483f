"""Everything a resume needs: the run state behind last.pt (the run's counters among it), every rank's random state,
the signals that stop a run."""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.errors import SAME_SIGNAL_SECONDS, CheckpointError
from ..loop import TrainState, unwrap_model
from .loss_meter import LossMeter, world_size
from .distributed import host_group
from .schedules import set_rate

if TYPE_CHECKING:
    from ..extensions.ema import WeightAverage


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuplify(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    """random.setstate wants tuples where a checkpoint round trip may give lists."""
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


RESUMABLE_KEYS = ("train_state", "model", "optimizer", "scheduler", "rng")


@dataclass
class RunCounters:
    """A run's epochs, clocks and best score: what the harness counts beside the loop's `TrainState`.

    Checkpoints hold both in one flat `train_state` dict (`RunState.state_dict`), as they did when
    TrainState held all of them, so older last.pt files resume as they are.
    """

    epoch: int = 0  # epochs completed
    best_metric: float | None = None  # best validation score so far (BLEU or loss)
    best_epoch: int = 0  # the epoch that scored it (at its end, or inside it with train.val_every_steps)
    train_seconds: float = 0.0  # time spent in optimizer steps (data included; compile warm-up, eval, saving not)
    wall_seconds: float = 0.0  # time spent in epochs: training, validation, BLEU and queueing checkpoints
    target_epoch: int | None = None  # the first epoch whose validation BLEU reached train.target_bleu
    target_seconds: float | None = None  # train_seconds at the end of that epoch
    flops: float = 0.0  # model FLOPs of the optimizer steps so far, all ranks (model_flops.train_step_flops)
    target_flops: float | None = None  # flops at the end of the epoch that reached train.target_bleu
    best_step: int = 0  # the optimizer step best_metric was scored at (last: older files end before it)

    # The same plain-dict round trip as TrainState's: each takes its own keys from the one flat dict.
    state_dict = TrainState.state_dict
    load_state_dict = TrainState.load_state_dict


@dataclass
class RunState:
    """Everything `last.pt` holds to continue a run exactly, behind one state_dict() / load_state_dict().

    The loop's and the run's counters, the model, the optimizer, the schedule, every rank's random-number state and,
    for a run stopped inside an epoch, the data loader's position and the epoch's loss sums; with
    `ema.decay` on, the weight average.
    """

    train_state: TrainState
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: Any  # TrainLoader or CopyLoader: state_dict() / load_state_dict()
    meter: LossMeter
    rank: int = 0
    ema: WeightAverage | None = None  # with ema.decay > 0 the weight average is resumed too
    counters: RunCounters = field(default_factory=RunCounters)

    def cut_short(self, max_steps: int) -> bool:
        """`max_steps` ended training inside an epoch: that epoch stays unfinished (no epoch file, a mid-epoch
        last.pt). A budget that lands exactly on an epoch's last batch completes that epoch."""
        return bool(max_steps) and self.train_state.step >= max_steps and self.loader.taken < len(self.loader)

    def counts(self) -> dict[str, Any]:
        """The one flat train_state dict every checkpoint file holds: the loop's counters, then the run's."""
        return {**self.train_state.state_dict(), **self.counters.state_dict()}

    def state_dict(self, mid_epoch: bool = False) -> dict[str, Any]:
        """The resumable state; under torchrun a collective (every rank's RNG state is gathered)."""
        rngs: list[Any] = [_rng_state()]
        if world_size() > 1:
            rngs = [None] * world_size()
            dist.all_gather_object(rngs, _rng_state())
        return {"train_state": self.counts(),
                "model": unwrap_model(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "loader": self.loader.state_dict() if mid_epoch else None,
                "meter": self.meter.state_dict() if mid_epoch else None,
                "rng": {str(r): s for r, s in enumerate(rngs)},
                **({"ema": self.ema.state_dict()} if self.ema is not None else {})}

    def load_state_dict(self, payload: dict[str, Any], source: Path | str = "last.pt") -> bool:
        """Restore everything from a `state_dict()` payload; returns True when it stopped inside an epoch."""
        missing = [k for k in RESUMABLE_KEYS if k not in payload]
        if missing:
            raise CheckpointError(f"{source} is not a resumable checkpoint (no {', '.join(missing)}); "
                                  "resume from the run's last.pt, or start a new run")
        try:
            return self._restore(payload)
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"cannot resume from {source}: {first[:200]}") from None

    def _restore(self, payload: dict[str, Any]) -> bool:
        unwrap_model(self.model).load_state_dict(payload["model"])
        # The moments come from last.pt; the settings (betas, eps, ...) and the schedule are the ones
        # given now, so a resumed run can change them (the saved param groups would otherwise win).
        settings = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        # PyTorch places each saved `step` by the saved groups' kernel flags: today's flags (train.fast may have
        # changed) must be in place before the load, or a fused Adam would find its steps on the wrong device.
        saved = payload["optimizer"]
        kernel = ("fused", "foreach", "capturable")
        groups = [{**g, **{k: now[k] for k in kernel if k in now}} for g, now in zip(saved["param_groups"], settings)]
        self.optimizer.load_state_dict({**saved, "param_groups": groups})
        for group, given in zip(self.optimizer.param_groups, settings):
            group.update(given)
        self.scheduler.load_state_dict(payload["scheduler"])  # the step count; the rate function stays ours
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            set_rate(group, base * fn(self.scheduler.last_epoch))  # the next step's rate under today's schedule
        self.train_state.load_state_dict(payload["train_state"])  # each takes its own keys of the one dict
        self.counters.load_state_dict(payload["train_state"])
        if self.ema is not None and payload.get("ema") is not None:
            self.ema.load_state_dict(payload["ema"])
        elif self.ema is not None:  # a run started without ema.decay: the average starts from the restored weights
            self.ema.reset()
        rng = payload["rng"].get(str(self.rank))
        if rng is not None:
            _set_rng_state(rng)
        if payload.get("loader") is None:
            return False
        self.loader.load_state_dict(payload["loader"])
        if payload.get("meter") is not None:  # absent in files written before the meter was saved
            self.meter.load_state_dict(payload["meter"])
        return True


# Under torchrun the ranks compare their signal flags about this often (seconds of training).
CHECK_SECONDS = 1.0

# A signal sent to the process group reaches training twice under a launcher that forwards it as well (`uv run`
# without a terminal, `timeout -s INT`): a second SIGINT within SAME_SIGNAL_SECONDS of the first is the same one,
# not a second Ctrl-C that asks to stop without saving.


class StopSignal:
    """Turns SIGTERM / SIGINT into a flag the training loop reads between steps (host only)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._signalled = 0.0  # time.monotonic() of the first signal
        self._previous: dict[int, Any] = {}
        self._every = self._steps_left = 1  # under torchrun: steps between comparisons, and steps to the next
        self._last_check = time.perf_counter()

    def install(self) -> None:
        """Catch SIGTERM and SIGINT from now on (main thread only)."""
        self._last_check = time.perf_counter()
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.signum is not None and signum == signal.SIGINT and now - self._signalled > SAME_SIGNAL_SECONDS:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        if self.signum is None:
            self.signum, self._signalled = signum, now

    def stop_now(self, distributed: bool, rank: int = 0, force: bool = False) -> bool:
        """Asked after every step (and with `force` at an epoch's end): whether training stops here.

        One process reads its own flag. Under torchrun the ranks compare flags every few steps, as
        many as take about CHECK_SECONDS on rank 0 (it measures, and the same collective tells
        everyone), so a signal to any rank stops all of them after the same step, a second or so
        later, for one small gloo message a second.
        """
        if not distributed:
            return self.signum is not None
        if not force:
            self._steps_left -= 1
            if self._steps_left > 0:
                return False
        now = time.perf_counter()
        proposal = 0.0
        if rank == 0 and not force:
            step_seconds = (now - self._last_check) / self._every
            proposal = float(min(1000, max(1, round(CHECK_SECONDS / max(step_seconds, 1e-6)))))
        flags = torch.tensor([0.0 if self.signum is None else 1.0, proposal])
        dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=host_group())  # (any rank's flag, rank 0's proposal)
        if not force:
            self._every = self._steps_left = max(1, int(flags[1]))
            self._last_check = now
        return bool(flags[0] > 0)
