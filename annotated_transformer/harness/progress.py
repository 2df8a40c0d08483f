"""How far a run is: its first line with its budget, its log, validation and epoch lines with the time left, and
the early warnings of a long run and of CPU cores shared with other processes."""

from __future__ import annotations

import math
import time
from collections.abc import Sized
from typing import Any, Protocol

import torch
from torch import nn

from ..config import Config, TrainConfig
from ..runtime.device import device_name, usable_cores
from ..loop import TrainState
from .distributed import DistInfo
from .malloc import malloc_in_use
from .metrics import Metrics
from .resume import RunCounters
from .run_dir import RunDir


class RunningRun(Protocol):
    """What a run's first line and its slow-run warning read of the Trainer (harness/trainer.py calls them)."""

    cfg: Config
    train_state: TrainState
    counters: RunCounters
    info: DistInfo
    run: RunDir
    metrics: Metrics
    model: nn.Module
    loader: Sized  # the training batches of an epoch
    device: torch.device
    amp_dtype: torch.dtype | None
    total_steps: int
    step_clock: float  # time.perf_counter() when the current stretch of steps began
    speed_mark: tuple[int, float, float, int]  # (step, train seconds, wall seconds, tokens) when timing began

SLOW_RUN_SECONDS = 3600.0  # a run whose training will take longer than this says so early (speed_warning)
SPEED_AFTER_STEPS = 20  # the early estimate waits for this many timed optimizer steps at a log line ...
SPEED_AFTER_SECONDS = 60.0  # ... or for this many seconds of them (then it looks once a minute between log lines)
SPEED_MIN_STEPS = 3  # and never estimates from fewer steps before an epoch's end
# A CPU training whose threads got less than this share of a core each over at least CPU_SHARE_SECONDS of steps
# shares its cores: alone, its threads got 0.98-0.99 (0.83 with OMP_WAIT_POLICY=PASSIVE); two trainings on the
# same cores got 0.5 each and ran 13-17x slower (docs/performance.md, "Sharing the CPU").
CPU_SHARE_MIN = 0.6
CPU_SHARE_SECONDS = 10.0


def start_line(tr: RunningRun) -> str:
    """The run's first line: model size, device, ranks, precision, batches, the run's length in epochs and steps
    and where it writes."""
    t = tr.cfg.train
    ranks = f" x {tr.info.world_size} ranks" if tr.info.distributed else ""
    return (f"{tr.cfg.name}: {tr.model.num_parameters() / 1e6:.2f}M parameters | device {tr.device}{ranks} | "
            f"precision {'bf16 autocast' if tr.amp_dtype else 'fp32'}{malloc_label(tr.device)} | "
            f"{len(tr.loader)} batches/epoch/rank{static_label(tr.loader)} | "
            f"accumulating {t.accum_steps} | {run_length(t, tr.total_steps, t.epoch_steps(len(tr.loader)))} | "
            f"run dir {tr.run.path}")


def static_label(loader: Sized) -> str:
    """' in K static shapes' when the batches come from the static plan (data.static_shapes), for the first line."""
    shapes = loader.shapes() if getattr(loader, "static_shapes", False) else []
    return f" in {len(shapes)} static shapes" if shapes else ""


def malloc_label(device: torch.device) -> str:
    """' | malloc NAME' on the CPU (the preloaded library, or 'system'): train.malloc's effect, for the first line."""
    return f" | malloc {malloc_in_use()}" if device.type == "cpu" else ""


def epoch_line(record: dict[str, Any], s: TrainState, c: RunCounters, t: TrainConfig, total_steps: int,
               since: tuple[int, float] = (0, 0.0)) -> str:
    """An epoch's log line: the step of the run's steps, losses, val BLEU, the epoch's seconds, both clocks, the
    target when reached, and the time the rest of the run will take (`time_left`, at the pace `since`)."""
    reached = (f" | target {t.target_bleu:g} reached at epoch {c.target_epoch} ({c.target_seconds / 60:.1f} min)"
               if c.target_epoch is not None else "")
    of = f"/{t.epochs}" if t.epochs else ""  # train.epochs=0: train.max_steps alone sets the length
    return (f"epoch {record['epoch']}{of} | step {s.step}/{total_steps} | {scores(record)} | "
            f"{record['seconds']:.1f} s | clocks: training {c.train_seconds / 60:.1f} min, epochs "
            f"{c.wall_seconds / 60:.1f} min{reached} | {time_left(s, c, t, total_steps, since=since)}")


def step_line(record: dict[str, Any], s: TrainState, c: RunCounters, t: TrainConfig, total_steps: int,
              since: tuple[int, float] = (0, 0.0)) -> str:
    """A validation inside an epoch (train.val_every_steps): like an epoch's line (the time left at the pace `since`),
    with the epoch's training loss so far and the validation's seconds."""
    return (f"validation at step {s.step}/{total_steps} (epoch {record['epoch']}) | {scores(record)} | "
            f"{record['eval_seconds']:.1f} s | clocks: training {c.train_seconds / 60:.1f} min, epochs "
            f"{c.wall_seconds / 60:.1f} min | {time_left(s, c, t, total_steps, since=since)}")


def scores(record: dict[str, Any]) -> str:
    """'train loss 3.1416 | val loss 2.9031 | val BLEU 12.34' of a validation's record (BLEU when scored)."""
    bleu = f" | val BLEU {record['bleu']:.2f}" if "bleu" in record else ""
    return f"train loss {record['train_loss']:.4f} | val loss {record['val_loss']:.4f}{bleu}"


def log_line_end(s: TrainState, c: RunCounters, t: TrainConfig, total_steps: int, wall_seconds: float,
                 train_seconds: float, since: tuple[int, float] = (0, 0.0)) -> str:
    """The end of a log line: how much of the run's steps is done and the time left (`time_left`, with this epoch's
    wall and training seconds so far): ' | 12% of 100,000 steps, about 3.2 h left'."""
    left = time_left(s, c, t, total_steps, wall_seconds, since, train_seconds)
    return f" | {s.step / total_steps:.0%} of {total_steps:,} steps, {left}"


# --------------------------------------------------------------------------- how long a run will take


def finished_line(path: Any, state: dict[str, Any], t: TrainConfig, mid_epoch: bool = False) -> str:
    """What train.resume=auto says of a finished run in `path` (`state`: its last.pt's train_state; `mid_epoch`:
    it ended inside an epoch, at train.max_steps): how far it went, and which of the limits it reached to raise to
    continue it."""
    epoch, step = state.get("epoch", 0), state.get("step", 0)
    reached = [f"train.{key} (now {limit})" for key, limit, at in (("epochs", t.epochs, epoch),
                                                                  ("max_steps", t.max_steps, step))
               if limit and at >= limit]
    if t.stop_at_target and state.get("target_epoch") is not None:
        reached.append(f"train.target_bleu (now {t.target_bleu}; or set train.stop_at_target=false)")
    went = (f"step {step}, in epoch {epoch + 1}" if mid_epoch
            else f"{epoch} epoch{'' if epoch == 1 else 's'} complete, {step} steps")
    return (f"{path} holds a finished run ({went}) and train.resume=auto leaves it "
            f"as it is; train again with train.overwrite=true or another train.out_dir, or raise "
            f"{' and '.join(reached)} to continue it")


def format_duration(seconds: float) -> str:
    """A duration as people read it: '45 s', '7.5 min', '25 min', '2.4 h'."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(seconds, 0.0)
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 597:  # 9.95 min: one decimal below ten minutes
        return f"{seconds / 60:.1f} min"
    if seconds < 3570:  # 59.5 min
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def seconds_left(steps_done: int, total_steps: int, seconds: float, steps_timed: int | None = None) -> float | None:
    """How long the rest of a run takes: its `total_steps - steps_done` optimizer steps at the speed measured so
    far, `seconds` for `steps_timed` steps (default: for all `steps_done`). None while no step is timed.

    With `seconds` the wall time of whole epochs, validation and BLEU are spread over the steps, as they
    come between them. E.g. 100 steps in 50 s of 1,000: 900 steps at 0.5 s, 450 s left.
    """
    timed = steps_done if steps_timed is None else steps_timed
    if timed <= 0 or seconds <= 0:
        return None
    return max(total_steps - steps_done, 0) * seconds / timed


def time_left(s: TrainState, c: RunCounters, t: TrainConfig, total_steps: int,
              wall_seconds: float | None = None, since: tuple[int, float] = (0, 0.0),
              train_seconds: float | None = None) -> str:
    """The end of an epoch line: 'about 12 min left' at the pace so far, 'at most ...' when the run may stop at
    train.target_bleu, or 'training done'.

    The pace is a step's training time plus its share of the rest (validation, BLEU, checkpoints: the run's wall
    time `wall_seconds` less its training time `train_seconds`; by default the counters'). `since`: the (step,
    training seconds) this process began at; a resumed run trains at this process's pace, not at that of the
    processes before it (another machine, or a busier one). Compilation is in neither clock's training time.
    """
    if t.finished(c.epoch, s.step, c.target_epoch is not None):
        return "training done"
    wall = c.wall_seconds if wall_seconds is None else wall_seconds
    train = c.train_seconds if train_seconds is None else train_seconds
    step0, train0 = since if s.step > since[0] and train > since[1] else (0, 0.0)  # no step of its own yet
    if s.step <= 0 or wall <= 0:
        return "time left unknown"
    pace = (train - train0) / (s.step - step0) + max(wall - train, 0.0) / s.step
    left = max(total_steps - s.step, 0) * pace
    return f"{'at most' if t.stop_at_target else 'about'} {format_duration(left)} left"


def run_length(t: TrainConfig, total_steps: int, epoch_steps: int = 0) -> str:
    """What a run trains for, as its config says it: '20 epochs (10,320 steps)', or '5,000 steps (train.max_steps)'
    when train.max_steps ends it, with the epochs that makes when an epoch's `epoch_steps` are given."""
    if t.max_steps and total_steps == t.max_steps:
        epochs = f", {total_steps / epoch_steps:.3g} epochs" if epoch_steps else ""
        return f"{total_steps:,} steps (train.max_steps{epochs})"
    return f"{t.epochs} epochs ({total_steps:,} steps)"


def device_label(device: torch.device, world_size: int = 1) -> str:
    """The device as the warning names it: 'cpu (AMD EPYC, 2 threads)', 'cuda:0 (NVIDIA H100 80GB HBM3) x 8 ranks'."""
    if device.type == "cuda":
        name = f" ({torch.cuda.get_device_name(device)})"
    elif device.type == "cpu":
        name = f" ({device_name(device)})"
    else:
        name = ""
    return f"{device}{name}" + (f" x {world_size} ranks" if world_size > 1 else "")


def quicker_config(cfg: Config, device: torch.device) -> str:
    """The warning's advice: on a CPU, the shipped config that trains a translator there in minutes ('' when
    none is quicker than this run: on a GPU, for the copy task, or for cpu_15min itself)."""
    quick = "cpu_15min" if cfg.data.src_lang == "de" else "cpu_15min_en_de"  # the same direction
    if device.type == "cpu" and cfg.data.dataset == "multi30k" and cfg.name != quick:
        return f"for a translator on a CPU in about 12-22 minutes of training use --config {quick}.yaml"
    return ""


def slow_run_warning(left: float | None, *, device: str, length: str, tokens_per_s: float, advice: str = "",
                     threshold: float | None = None) -> str | None:
    """The one-line warning of a long run when `left` (seconds of training still to come) exceeds `threshold`
    (default SLOW_RUN_SECONDS); None otherwise."""
    limit = SLOW_RUN_SECONDS if threshold is None else threshold
    if left is None or left <= limit:
        return None
    return (f"warning: this run will take about {format_duration(left)} on {device}: {length} at "
            f"{tokens_per_s:,.0f} tokens/s" + (f"; {advice}" if advice else ""))


def speed_warning(tr: RunningRun, at_epoch_end: bool) -> str | None:
    """The early warning from the optimizer steps this process has timed since `fit` began (start-up and the
    compile step left out): during the first epoch once SPEED_AFTER_STEPS steps or SPEED_AFTER_SECONDS seconds are
    timed (training alone), at its end with its validation. None: quick enough, or not timed enough yet."""
    s, c, t = tr.train_state, tr.counters, tr.cfg.train
    step0, train0, wall0, tokens0 = tr.speed_mark
    train = c.train_seconds - train0 + (0.0 if at_epoch_end else time.perf_counter() - tr.step_clock)
    steps = s.step - step0 - (1 if t.compile else 0)  # a compiled model's first step compiles, untimed
    early = not at_epoch_end and steps < SPEED_AFTER_STEPS and train < SPEED_AFTER_SECONDS
    if early or steps < (1 if at_epoch_end else SPEED_MIN_STEPS):
        return None
    seconds = c.wall_seconds - wall0 - (tr.metrics.compile_seconds or 0.0) if at_epoch_end else train
    return slow_run_warning(seconds_left(s.step, tr.total_steps, seconds, steps),
                            device=device_label(tr.device, tr.info.world_size),
                            length=run_length(t, tr.total_steps, t.epoch_steps(len(tr.loader))),
                            tokens_per_s=(s.tokens - tokens0) * tr.info.world_size / max(train, 1e-9),
                            advice=quicker_config(tr.cfg, tr.device))


def cpu_clocks() -> tuple[float, float]:
    """(the CPU seconds of this process's threads, the wall clock): what the shared-CPU check compares."""
    return time.process_time(), time.perf_counter()


class CpuShare:
    """The CPU time a training's threads get over its steps (validation, saving and a compile step left out, as
    `start` and `pause` bracket the steps), judged by `shared_cpu_warning` once the steps add up to
    CPU_SHARE_SECONDS; settled after one warning, or from the start when not `judged` (a GPU run, a rank of many:
    its waits for the others are no share of the CPU)."""

    def __init__(self, judged: bool = True) -> None:
        self.settled = not judged
        self.spent = (0.0, 0.0)  # (CPU, wall) seconds of the steps not yet judged, before the current stretch
        self.mark: tuple[float, float] | None = None  # the clocks when the current stretch began; None between

    def start(self) -> None:
        """Begin a stretch of steps (again after a compile step: its time is not counted)."""
        if not self.settled:
            self.mark = cpu_clocks()

    def pause(self) -> None:
        """End the stretch: its seconds wait, with the earlier ones, for the next judgement."""
        if self.mark is not None:
            self.spent = self._seconds(cpu_clocks())
        self.mark = None

    def check(self) -> str | None:
        """After a step: the warning line, once, when the steps not yet judged add up and torch's threads got too
        little of a core each; None otherwise."""
        if self.settled or self.mark is None:
            return None
        now = cpu_clocks()
        cpu, wall = self._seconds(now)
        if wall < CPU_SHARE_SECONDS:
            return None
        line = shared_cpu_warning(cpu, wall, torch.get_num_threads(), usable_cores())
        self.spent, self.mark, self.settled = (0.0, 0.0), now, line is not None
        return line

    def _seconds(self, now: tuple[float, float]) -> tuple[float, float]:
        (cpu, wall), (cpu0, wall0), (cpu1, wall1) = self.spent, self.mark, now
        return cpu + cpu1 - cpu0, wall + wall1 - wall0


def shared_cpu_warning(cpu_seconds: float, wall_seconds: float, threads: int, cores: int) -> str | None:
    """The one-line warning of a CPU training whose `threads` got under CPU_SHARE_MIN of a core each (`cpu_seconds`
    of the process over `wall_seconds` of steps); None when they got it, or the steps were too short to judge.

    The threads of one operation wait for each other at its end, so threads that share cores cost far more than
    their share (one thread alone waits for nobody: not judged); the advice is fewer threads, never more.
    """
    if wall_seconds < CPU_SHARE_SECONDS or threads < 2:
        return None
    used = cpu_seconds / wall_seconds  # cores' worth of time the process got
    if used >= CPU_SHARE_MIN * threads:
        return None
    got = f"{used:.1f} {'core' if f'{used:.1f}' == '1.0' else 'cores'}"
    if threads > cores:
        cause = f"more threads than the {cores} cores"
        fix = f"set OMP_NUM_THREADS={cores} or fewer"
    else:  # other processes, or a CPU quota below the cores it sees
        cause = f"other programs on these {cores} cores"
        fix = (f"stop them, or give each program its own cores (e.g. OMP_NUM_THREADS="
               f"{max(1, min(threads - 1, int(used)))} for this training)")
    return (f"warning: training's {threads} threads got {got} of CPU time over the last {wall_seconds:.0f} s of "
            f"steps; {cause} can slow steps several times: {fix} (docs/performance.md#sharing-the-cpu)")
