"""A run's checkpoint writer (`Checkpointer`): last.pt, the best, epoch and step model files, the average, resuming.

The files' formats, and reading and writing them, are checkpoints.py's; this module binds them to one
run directory, one rank's state and the ranks of a torchrun job.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from ..runtime.errors import RunDirError, TrainingDiverged, UserError
from ..loop import Log, unwrap_model
from ..checkpoints import CheckpointWriter, TwoRunsWarning, average_into, load_checkpoint, model_file
from .distributed import DistInfo
from .loss_meter import weights_finite, world_size
from .resume import RunState
from .run_dir import RunDir


def broadcast_weights(model: nn.Module) -> None:
    """Give every rank rank 0's weights (no-op on one process)."""
    if world_size() > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def improves(metric: float | None, best: float | None, best_metric: str) -> bool:
    """Whether an epoch's `metric` makes a new best: higher BLEU or lower loss (train.best_metric);
    a missing figure never does, anything beats no best yet."""
    if metric is None:
        return False
    return best is None or (metric > best if best_metric == "bleu" else metric < best)


class Checkpointer:
    """A run's checkpoint files: last.pt (resumable), and the model files best, epoch_NN, step_NNNNNNN and avg
    (weights).

    With `ema.decay` on, best, epoch_NN and step_NNNNNNN hold the weight average (what validation scored) and
    last.pt the raw weights beside the average.

    Every rank takes part in a save (the random states are gathered); rank 0 copies the state to
    the CPU and a background `CheckpointWriter` writes it while training goes on.
    """

    def __init__(self, run: RunDir, run_state: RunState, info: DistInfo, common: dict[str, Any]) -> None:
        self.run, self.run_state, self.info = run, run_state, info
        self.common = common  # what every file carries: the config and the text pipeline
        self.writer = CheckpointWriter(run.path)
        self.saved_step: int | None = None  # the step of the newest last.pt on disk (None: there is none yet)
        self._queued_step: int | None = None  # the step of a last.pt the writer has not finished

    def resume(self, last: dict[str, Any], log: Log) -> bool:
        """Continue from last.pt's payload: the run state restored, later metrics records dropped; True when
        it stopped inside an epoch."""
        mid_epoch = self.run_state.load_state_dict(last, self.run.last)
        step = self.saved_step = self.run_state.train_state.step
        if self.info.is_main:
            self.run.truncate_metrics(step)
        epoch = self.run_state.counters.epoch  # complete epochs: counted as the stop line counts them
        log(f"resumed {self.run.last}: " + (f"in epoch {epoch + 1}" if mid_epoch else f"after epoch {epoch}")
            + f" at step {step}")
        if last.get("ema") is not None and self.run_state.ema is None:
            log(f"{self.run.last} holds a weight average that ema.decay=0 drops: from here on validation scores the "
                "raw weights (the best model file so far holds the average); resume with its ema.decay to keep it")
        return mid_epoch

    def save(self, mid_epoch: bool, weights_to: Sequence[Path] = (), last: bool = True,
             then: Callable[[], None] | None = None) -> None:
        """Queue last.pt (unless `last` is false), and the weights alone to the model files `weights_to`, then `then`
        (once they are on disk: deleting older files); never from weights that are not finite."""
        step = self.run_state.train_state.step
        if not weights_finite(self.run_state.model):  # a last line of defence: never overwrite good files
            raise TrainingDiverged(f"training diverged: the weights are not finite at step {step}; nothing was "
                                   "saved from them. Lower train.lr_factor or set train.clip_grad_norm")
        resumable = self.run_state.state_dict(mid_epoch=mid_epoch) if last else None  # a collective: all ranks
        if not self.info.is_main:  # nothing to write here: rank 0's file is the one
            if last:
                self.saved_step = step
            return
        self.wait()  # the previous save's files: a failure is named before new ones are queued
        jobs = []
        if resumable is not None:
            self._queued_step = step
            jobs.append(({**self.common, **resumable}, [self.run.last]))
        if weights_to:  # the weights validation scored: the raw ones, or their average (ema)
            ema, model = self.run_state.ema, unwrap_model(self.run_state.model)
            weights = model.state_dict() if ema is None else ema.averaged_state_dict(model)
            jobs.insert(0, ({**self.common, "model": weights, "train_state": self.run_state.counts()}, weights_to))
        self.writer.save(*jobs, then=then)

    def wait(self) -> None:
        """Until every queued file is on disk; a write that failed is one line naming the last good checkpoint."""
        try:
            self.writer.wait()
        except UserError as exc:
            self._queued_step = None
            if self.saved_step is None:
                good = "no checkpoint of this run was written before it"
            elif getattr(exc, "resumes_from", None) is not None:  # the full-disk line already says to resume from it
                good = f"it holds step {self.saved_step}"
            else:
                good = f"the last good checkpoint is {self.run.last} (step {self.saved_step})"
            raise RunDirError(f"{exc}; {good}") from None
        if self._queued_step is not None:
            self.saved_step, self._queued_step = self._queued_step, None

    def check(self) -> None:
        """After every step: a background write that failed stops the run now (never waits for one under way)."""
        if self.writer.finished():
            self.wait()

    def restart_hint(self) -> str:
        """How to go on after a divergence: from the last good last.pt, or from scratch."""
        self.wait()
        if self.saved_step is not None:
            return f"rerun to continue from {self.run.last} (step {self.saved_step}, the last good state)"
        return "start again with train.overwrite=true (no checkpoint was written before the divergence)"

    def load_model_file(self, model: nn.Module, path: Path) -> Path | None:
        """Load `path`'s weights on rank 0 and give them to every rank; the file read, or None when rank 0 has
        no such file. A run begun by an older version may hold them as a .pt file of the same name (best.pt)."""
        path = model_file(path)
        found = [self.info.is_main and path.is_file()]
        if self.info.distributed:
            dist.broadcast_object_list(found, src=0)
        if found[0]:
            if self.info.is_main:
                device = next(model.parameters()).device
                model.load_state_dict(load_checkpoint(path, map_location=device)["model"])
            broadcast_weights(model)
        return path if found[0] else None

    def average_last(self, n: int, log: Log, steps: bool = False) -> Path | None:
        """Average the newest `n` epoch files (with `steps`, step files) into the run's avg file (rank 0); None if
        n < 2 or too few exist."""
        if n < 2:
            return None
        paths = [path for _, path in (self.run.step_files() if steps else self.run.epoch_files())[-n:]]
        enough = [len(paths) >= n]
        if self.info.distributed:
            dist.broadcast_object_list(enough, src=0)
        if not enough[0]:
            log(f"train.average_last={n} but only {len(paths)} {'step' if steps else 'epoch'} checkpoints exist; "
                "not averaging")
            return None
        if self.info.is_main:
            with warnings.catch_warnings():  # its own files, even of a run moved and continued with another seed
                warnings.simplefilter("ignore", TwoRunsWarning)
                average_into(paths, self.run.avg, overwrite=True, run=self.run.path)  # the run's own avg file
            log(f"averaged {', '.join(p.name for p in paths)} into {self.run.avg}")
        return self.run.avg
