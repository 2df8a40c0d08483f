"""Training: the notebook's `TrainState` and `run_epoch`, one `train_step`, and the `Trainer` behind `train_worker`.

Loss normalisation: an optimizer step may span `accum_iter` micro-batches on each of
`world_size` ranks. Its loss is the sum of the per-token losses of all of them divided by their
total number of non-padding target tokens, so the gradient is exactly the gradient of one big
batch, however the tokens are split between micro-batches and ranks. Every rank knows that total
on the host (all ranks follow one batch plan, see `data.loader`), and divides its summed loss by
(global tokens / world_size) because DDP averages gradients over ranks.

No host synchronisation per step: losses (and gradient norms) are summed on the device and read
once per log interval (`LossMeter`), where a non-finite value stops the run (`TrainingDiverged`).
"""

from __future__ import annotations

import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from .checkpoint import CheckpointWriter, average_checkpoints, load_checkpoint, save_checkpoint, unwrap_model
from .config import Config, config_to_dict
from .data.batch import Batch
from .device import amp_context, resolve_amp_dtype
from .distributed import DistInfo, all_reduce_sum, barrier, cleanup, init_distributed, print0, world_size
from .errors import CheckpointError, DistributedError, TrainingDiverged
from .files import writing
from .loss import LabelSmoothing, SimpleLossCompute
from .model import make_model_from_config
from .monitor import GPUMonitor, format_gpu, peak_memory_gb
from .optim import build_optimizer, build_scheduler
from .run_dir import RunDir
from .tasks import build_task
from .tensorboard_log import TensorBoardLog, summary_writer_class

Log = Callable[[str], None]


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
    train_seconds: float = 0.0  # time spent in optimizer steps (data included; compile warm-up, eval, saving not)
    wall_seconds: float = 0.0  # time spent in epochs: training, validation, BLEU and queueing checkpoints
    target_epoch: int | None = None  # the first epoch whose validation BLEU reached train.target_bleu
    target_seconds: float | None = None  # train_seconds at the end of that epoch

    def state_dict(self) -> dict[str, Any]:
        """A plain dict for checkpoints."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()` output."""
        for key, value in state.items():
            setattr(self, key, value)


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
        self.window_time = time.perf_counter()

    def add(self, loss_sum: Tensor, tokens: int, grad_norm: Tensor | None = None) -> None:
        """Count one batch's (or step's) summed loss and tokens; device additions only."""
        self.epoch_loss += loss_sum
        self.window_loss += loss_sum
        if grad_norm is not None:
            self.window_grad_norm += grad_norm
        self.epoch_tokens += tokens
        self.window_tokens += tokens

    def read_window(self) -> dict[str, float]:
        """Loss per token, tokens/s and finiteness of the window over all ranks; starts a new window."""
        loss, grad_norm, tokens = self._over_ranks(self.window_loss, self.window_grad_norm, self.window_tokens)
        elapsed = time.perf_counter() - self.window_time
        self.window_loss.zero_()
        self.window_grad_norm.zero_()
        self.window_tokens, self.window_time = 0, time.perf_counter()
        return {"loss": loss / max(tokens, 1.0), "tokens_per_s": tokens / max(elapsed, 1e-9),
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
        """The sums as plain numbers (a host sync), so a resumed epoch reports the whole epoch's loss."""
        return {"epoch_loss": self.epoch_loss.item(), "epoch_tokens": self.epoch_tokens,
                "window_loss": self.window_loss.item(), "window_grad_norm": self.window_grad_norm.item(),
                "window_tokens": self.window_tokens}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue from `state_dict()` output."""
        for name in ("epoch_loss", "window_loss", "window_grad_norm"):
            getattr(self, name).fill_(state[name])
        self.epoch_tokens, self.window_tokens = int(state["epoch_tokens"]), int(state["window_tokens"])


def step_norm(group: list[Batch], ws: int) -> float:
    """What this rank divides its summed loss by: global non-padding target tokens / world size (host ints)."""
    if ws == 1:
        return float(max(sum(b.ntokens for b in group), 1))
    if any(b.global_ntokens is None for b in group):
        raise ValueError("under torchrun each training batch needs global_ntokens (set by the training loaders)")
    return max(sum(b.global_ntokens for b in group), 1) / ws


def train_step(group: list[Batch], model: nn.Module, loss_compute: SimpleLossCompute,
               optimizer: torch.optim.Optimizer, scheduler: Any, *, amp_dtype: torch.dtype | None = None,
               clip_grad_norm: float = 0.0, ws: int = 1) -> tuple[Tensor, Tensor | None]:
    """One optimizer step over the micro-batches of `group` (already on the device).

    Forward and backward of each micro-batch (DDP all-reduces only after the last), optional
    clipping, the optimizer and the schedule. Returns the summed loss and the gradient norm
    (when clipping) as device tensors: nothing here waits for the device.
    """
    norm = step_norm(group, ws)
    device = group[0].src.device
    loss_sum: Tensor | None = None
    for i, batch in enumerate(group):
        sync = model.no_sync() if isinstance(model, DDP) and i < len(group) - 1 else nullcontext()
        with sync:
            with amp_context(device, amp_dtype):
                out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
                batch_loss, loss = loss_compute(out, batch.tgt_y, norm)
            loss.backward()
        loss_sum = batch_loss if loss_sum is None else loss_sum + batch_loss
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm) if clip_grad_norm > 0 else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return loss_sum, grad_norm


def _groups(data_iter: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """Consecutive lists of `size` batches (the last may be shorter), drawn only when asked for."""
    it = iter(data_iter)
    while group := list(islice(it, size)):
        yield group


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
    log: Log | None = print,
    on_log: Callable[[dict[str, float]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: Any = None,
    meter: LossMeter | None = None,
) -> tuple[float, TrainState]:
    """Train (mode='train') or evaluate (mode='eval') over `data_iter`; return (mean loss per token, state).

    Training groups `accum_iter` micro-batches into one `train_step`. Every `log_every` steps the
    window's loss, tokens/s and learning rate go to `log` (a line) and `on_log` (a dict), and a
    non-finite loss raises `TrainingDiverged`. `should_stop` is asked after every step;
    `max_steps` > 0 stops when `train_state.step` reaches it; `progress` (a tqdm bar) advances
    once per step; `meter` carries the loss sums of an epoch resumed mid-way. The returned loss
    is summed over ranks and divided by the tokens of all ranks.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    training = mode == "train"
    if training and (optimizer is None or scheduler is None):
        raise ValueError("training needs an optimizer and a scheduler")
    state = train_state if train_state is not None else TrainState()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    meter = meter if meter is not None else LossMeter(device)
    model.train(training)
    ws = world_size()
    with nullcontext() if training else torch.no_grad():
        for group in _groups(data_iter, accum_iter if training else 1):
            group = [b.to(device, non_blocking=True) for b in group]
            tokens = sum(b.ntokens for b in group)
            if training:
                loss_sum, grad_norm = train_step(group, model, loss_compute, optimizer, scheduler, amp_dtype=amp_dtype,
                                                 clip_grad_norm=clip_grad_norm, ws=ws)
            else:
                with amp_context(device, amp_dtype):
                    out = model(group[0].src, group[0].tgt, group[0].src_mask, group[0].tgt_mask)  # (B, T, d)
                    loss_sum, grad_norm = loss_compute(out, group[0].tgt_y, 1.0)[0], None
            meter.add(loss_sum, tokens, grad_norm)
            state.micro_step += len(group)
            state.samples += sum(len(b) for b in group)
            state.tokens += tokens
            if not training:
                continue
            state.step += 1
            if progress is not None:
                progress.update(1)
            if state.step % log_every == 0:
                _log_window(meter, state, optimizer, log, on_log, progress, log_every)
            if (max_steps and state.step >= max_steps) or (should_stop is not None and should_stop()):
                break
    loss = meter.read_epoch()
    if training and not math.isfinite(loss):
        raise _diverged(state, "the epoch's loss", loss, state.step - state.step % log_every)
    return loss, state


def _log_window(meter: LossMeter, state: TrainState, optimizer: torch.optim.Optimizer, log: Log | None,
                on_log: Callable[[dict[str, float]], None] | None, progress: Any, log_every: int) -> None:
    """Read the window's figures (one sync), stop on a non-finite loss, report them."""
    window = meter.read_window()
    if not window.pop("finite"):
        raise _diverged(state, "the loss or the gradient norm", window["loss"], state.step - log_every)
    figures = {"step": state.step, **window, "lr": optimizer.param_groups[0]["lr"]}
    if log is not None:
        log(f"step {state.step:6d} | loss {figures['loss']:7.4f} | {figures['tokens_per_s']:9.0f} tok/s | "
            f"lr {figures['lr']:.3e}")
    if progress is not None:
        progress.set_postfix(loss=f"{figures['loss']:.3f}", tok_s=f"{figures['tokens_per_s']:.0f}",
                             lr=f"{figures['lr']:.2e}")
    if on_log is not None:
        on_log(figures)


def _diverged(state: TrainState, what: str, value: float, after_step: int) -> TrainingDiverged:
    return TrainingDiverged(
        f"training diverged: {what} became {value} between steps {after_step + 1} and {state.step} "
        f"(epoch {state.epoch + 1}); nothing was saved from these weights. Lower train.lr_factor or set "
        "train.clip_grad_norm (e.g. 1.0)")


def weights_finite(model: nn.Module) -> bool:
    """True when every parameter is finite (one host sync)."""
    return bool(torch.stack([p.detach().isfinite().all() for p in model.parameters()]).all())


# --------------------------------------------------------------------------- everything a resume needs


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
class RunState:
    """Everything `last.pt` holds to continue a run exactly, behind one state_dict() / load_state_dict().

    The counters, the model, the optimizer, the schedule, every rank's random-number state and,
    for a run stopped inside an epoch, the data loader's position and the epoch's loss sums.
    """

    counters: TrainState
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: Any  # TrainLoader or CopyLoader: state_dict() / load_state_dict()
    meter: LossMeter
    rank: int = 0

    def state_dict(self, mid_epoch: bool = False) -> dict[str, Any]:
        """The resumable state; under torchrun a collective (every rank's RNG state is gathered)."""
        rngs: list[Any] = [_rng_state()]
        if world_size() > 1:
            rngs = [None] * world_size()
            dist.all_gather_object(rngs, _rng_state())
        return {"train_state": self.counters.state_dict(), "model": unwrap_model(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "loader": self.loader.state_dict() if mid_epoch else None,
                "meter": self.meter.state_dict() if mid_epoch else None,
                "rng": {str(r): s for r, s in enumerate(rngs)}}

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
        self.optimizer.load_state_dict(payload["optimizer"])
        for group, given in zip(self.optimizer.param_groups, settings):
            group.update(given)
        self.scheduler.load_state_dict(payload["scheduler"])  # the step count; the rate function stays ours
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)  # the next step's rate under today's schedule
        self.counters.load_state_dict(payload["train_state"])
        rng = payload["rng"].get(str(self.rank))
        if rng is not None:
            _set_rng_state(rng)
        if payload.get("loader") is None:
            return False
        self.loader.load_state_dict(payload["loader"])
        if payload.get("meter") is not None:  # absent in files written before the meter was saved
            self.meter.load_state_dict(payload["meter"])
        return True


# --------------------------------------------------------------------------- the driver


class StopSignal:
    """Turns SIGTERM / SIGINT into a flag the training loop reads between steps (host only)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Catch SIGTERM and SIGINT from now on (main thread only)."""
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
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signum = signum

    def agreed(self, device: torch.device) -> bool:
        """True when any rank received a signal: a collective, so every rank stops at the same step."""
        flag = torch.tensor(0.0 if self.signum is None else 1.0, device=device)
        return bool(all_reduce_sum(flag) > 0)


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device, compile: bool) -> nn.Module:
    """The module the training step calls: compiled inside, DDP outside.

    DDP must be the outer wrapper: `train_step` finds it with isinstance to skip the gradient
    all-reduce (`no_sync`) on all but the last micro-batch; torch.compile(DDP(...)) would hide it.
    Every bucketed batch has its own (B, S, T): one compile for symbolic shapes, not one per shape.
    """
    wrapped = torch.compile(model, dynamic=True) if compile else model
    if info.distributed:
        wrapped = DDP(wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    return wrapped


def _broadcast_weights(model: nn.Module) -> None:
    """Give every rank rank 0's weights (no-op on one process)."""
    if world_size() > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


class Trainer:
    """One rank's training run: built from a config, then `fit()`.

    The loop reads like the paper's training section: for each epoch, `train_step` over its
    batches (inside `run_epoch`), then `evaluate` and `save`; at the end `finish` (averaging,
    final scores, examples).
    """

    def __init__(self, cfg: Config, info: DistInfo, device: torch.device, plan: str = "start",
                 last: dict[str, Any] | None = None) -> None:
        self.cfg, self.info, self.device, self.log = cfg, info, device, print0
        self.t_start = time.perf_counter()
        self.run = RunDir(cfg.run_dir())
        if cfg.train.tensorboard and info.is_main:
            summary_writer_class()  # a missing package is an error before anything is written
        if info.is_main:
            self.run.prepare(cfg, plan)
        barrier()
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.task = build_task(cfg, info, log=self.log)
        if info.is_main and self.task.text is not None:
            with writing(self.run.vocab):
                self.task.text.save(self.run.vocab)
        self._build_model()
        self.loader = self.task.train_loader(pin_memory=device.type == "cuda")
        self.scheduler = build_scheduler(self.optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup,
                                         cfg.train.schedule, self.total_steps(), cfg.train.final_lr_ratio)
        self.val_batches = self.task.val_batches()
        self.state = RunState(TrainState(), self.model, self.optimizer, self.scheduler, self.loader,
                              LossMeter(device), info.rank)
        self.counters = self.state.counters
        self.saved_step: int | None = None  # the step of the newest last.pt (None: there is none yet)
        self.mid_epoch = self._resume(last) if plan == "resume" else False
        self.train_model = wrap_model(self.model, info, device, cfg.train.compile)
        self.writer = CheckpointWriter()  # rank 0 writes checkpoints in the background while training goes on
        self.stopper = StopSignal()
        self.monitor = GPUMonitor(device)
        self.gpu_samples: list[dict[str, float]] = []
        self.compile_seconds: float | None = None if cfg.train.compile else 0.0  # measured on the first step
        self.step_clock = 0.0  # when the current stretch of timed optimizer steps began
        self.text_state = self.task.text.state_dict() if self.task.text is not None else None
        self.cfg_dict = config_to_dict(cfg)
        self.tensorboard = TensorBoardLog(self.run.tensorboard) if cfg.train.tensorboard and info.is_main else None

    def _build_model(self) -> None:
        """Model, loss, optimizer and precision from the config (the schedule needs the loader's length)."""
        m, t = self.cfg.model, self.cfg.train
        self.model = make_model_from_config(m, self.task.src_vocab_size, self.task.tgt_vocab_size).to(self.device)
        criterion = LabelSmoothing(self.task.tgt_vocab_size, self.task.pad, t.label_smoothing)
        self.loss_compute = SimpleLossCompute(self.model.generator, criterion)
        self.optimizer = build_optimizer(self.model, betas=tuple(t.adam_betas), eps=t.adam_eps)
        self.amp_dtype = resolve_amp_dtype(t.precision, self.device)

    def _resume(self, last: dict[str, Any]) -> bool:
        """Load last.pt into the run state; True when it stopped inside an epoch."""
        mid_epoch = self.state.load_state_dict(last, self.run.last)
        self.saved_step = self.counters.step
        if self.info.is_main:
            self.run.truncate_metrics(self.counters.step)
        self.log(f"resumed {self.run.last}: epoch {self.counters.epoch}, step {self.counters.step}")
        return mid_epoch

    def total_steps(self) -> int:
        """The optimizer steps this run will take: train.max_steps, or train.epochs' worth if fewer."""
        t = self.cfg.train
        by_epochs = t.epochs * -(-len(self.loader) // t.accum_steps)  # the last group of an epoch may be short
        return min(x for x in (by_epochs, t.max_steps) if x > 0)

    def done(self) -> bool:
        """Training is over when the epochs are done or the step budget is spent."""
        return self.cfg.train.finished(self.counters.epoch, self.counters.step, self.counters.target_epoch is not None)

    def fit(self) -> dict[str, Any]:
        """Train epoch by epoch until done; a signal saves last.pt and stops; then finish."""
        m, t = self.model, self.cfg.train
        self.log(f"{self.cfg.name}: {m.num_parameters() / 1e6:.2f}M parameters | device {self.device}"
                 f"{f' x {self.info.world_size} ranks' if self.info.distributed else ''} | precision "
                 f"{'bf16 autocast' if self.amp_dtype else 'fp32'} | {len(self.loader)} batches/epoch/rank | "
                 f"accumulating {t.accum_steps} | run dir {self.run.path}")
        self.stopper.install()
        self.startup_seconds, self.startup_reported = time.perf_counter() - self.t_start, False
        if self.info.is_main:
            self.record({"kind": "start", "step": self.counters.step, "params": m.num_parameters(),
                         "device": str(self.device), "world_size": self.info.world_size,
                         "threads": torch.get_num_threads(), "precision": str(self.amp_dtype or "fp32"),
                         "startup_seconds": self.startup_seconds})
        try:
            while not self.done():
                epoch, t_epoch = self.counters.epoch, time.perf_counter()
                train_loss = self.train_epoch()
                if self.stopping:
                    self.counters.wall_seconds += time.perf_counter() - t_epoch
                    return self.stop(epoch)
                record = self.evaluate(epoch, train_loss, time.perf_counter() - t_epoch)
                self.save(record, t_epoch)
            self.stopper.restore()  # from here on Ctrl-C interrupts at once
            self.writer.wait()  # best.pt on disk before finish reads it back
            return self.finish()
        except TrainingDiverged as exc:
            raise TrainingDiverged(f"{exc}, then {self._restart_hint()}") from None
        finally:
            self.stopper.restore()
            self.writer.wait()  # every checkpoint on disk before the process exits
            if self.tensorboard is not None:
                self.tensorboard.close()

    def _restart_hint(self) -> str:
        """How to go on after a divergence: from the last good last.pt, or from scratch."""
        self.writer.wait()
        if self.saved_step is not None:
            return f"rerun to continue from {self.run.last} (step {self.saved_step}, the last good state)"
        return "start again with train.overwrite=true (no checkpoint was written before the divergence)"

    def train_epoch(self) -> float:
        """One epoch (or the rest of a resumed one) of `train_step`; returns its mean training loss."""
        t = self.cfg.train
        if not self.mid_epoch:
            self.loader.set_epoch(self.counters.epoch)
            self.state.meter = LossMeter(self.device)
        self.mid_epoch, self.stopping = False, False
        steps = -(-len(self.loader) // t.accum_steps)  # the last group may be short
        bar = tqdm(total=steps, desc=f"epoch {self.counters.epoch + 1}", leave=False, dynamic_ncols=True,
                   disable=True if not (self.info.is_main and t.progress) else None)  # None: off without a TTY
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.gpu_samples.clear()
        self.step_clock = time.perf_counter()
        with bar:
            loss, _ = run_epoch(
                self.loader, self.train_model, self.loss_compute, self.optimizer, self.scheduler,
                accum_iter=t.accum_steps, train_state=self.counters, device=self.device, amp_dtype=self.amp_dtype,
                clip_grad_norm=t.clip_grad_norm, max_steps=t.max_steps, log_every=t.log_every,
                log=(self.log if bar.disable else bar.write) if self.info.is_main else None, on_log=self._on_log,
                should_stop=self._should_stop, progress=None if bar.disable else bar, meter=self.state.meter)
        self.counters.train_seconds += time.perf_counter() - self.step_clock
        return loss

    def _should_stop(self) -> bool:
        """After each step: a signal arrived (on one process at once; under torchrun agreed at log intervals)."""
        if self.compile_seconds is None:  # the first step of a compiled model: compile time, not training time
            self.compile_seconds = time.perf_counter() - self.step_clock
            self.step_clock = time.perf_counter()
        if not self.info.distributed:
            self.stopping = self.stopper.signum is not None
        elif self.counters.step % self.cfg.train.log_every == 0:
            self.stopping = self.stopper.agreed(self.device)
        return self.stopping

    def _on_log(self, figures: dict[str, float]) -> None:
        sample = self.monitor.sample()
        if sample:
            self.gpu_samples.append(sample)
        if self.info.is_main:
            self.record({"kind": "train", "epoch": self.counters.epoch + 1, **figures})

    def record(self, record: dict[str, Any]) -> None:
        """One metrics record (rank 0): a line of metrics.jsonl, and scalars for TensorBoard when asked."""
        self.run.log_metrics(record)
        if self.tensorboard is not None:
            self.tensorboard.add(record)

    def stop(self, epoch: int) -> dict[str, Any]:
        """A signal stopped training inside `epoch`: save last.pt with the data position, report, return."""
        self._save_checkpoints({}, mid_epoch=True)
        name = signal.Signals(self.stopper.signum).name if self.stopper.signum else "a signal on another rank"
        self.log(f"stopped by {name} in epoch {epoch + 1} at step {self.counters.step}; saved {self.run.last}; "
                 "run the same command again to continue (train.resume=auto)")
        return {"stopped_by": self.stopper.signum or signal.SIGTERM}

    def evaluate(self, epoch: int, train_loss: float, seconds: float) -> dict[str, Any]:
        """Validation loss (and BLEU when due) after `epoch`; the epoch's metrics record with its clocks."""
        t, s, t_eval = self.cfg.train, self.counters, time.perf_counter()
        if not self.cut_short():
            s.epoch = epoch + 1
        val_loss, _ = run_epoch(self.val_batches, self.model, self.loss_compute, mode="eval", device=self.device,
                                amp_dtype=self.amp_dtype, log=None)
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": s.step, "train_loss": train_loss,
                                  "val_loss": val_loss, "seconds": seconds}
        if self.task.name == "multi30k" and t.bleu_every and ((epoch + 1) % t.bleu_every == 0 or self.done()):
            scored = self.task.score(self.model, self.device, "val", beam_size=1, amp_dtype=self.amp_dtype)
            record.update(bleu=scored["bleu"], bleu_signature=scored["bleu_signature"])
            if t.target_bleu and s.target_epoch is None and scored["bleu"] >= t.target_bleu:
                s.target_epoch, s.target_seconds = epoch + 1, s.train_seconds
        record.update(train_seconds=s.train_seconds, eval_seconds=time.perf_counter() - t_eval,
                      **self._one_off_clocks())
        if s.target_epoch is not None:
            record.update(target_bleu=t.target_bleu, target_epoch=s.target_epoch, target_seconds=s.target_seconds)
        if self.gpu_samples:
            record["gpu_util"] = sum(x["gpu_util"] for x in self.gpu_samples) / len(self.gpu_samples)
            record["gpu_mem_used_gb"] = max(x["gpu_mem_used_gb"] for x in self.gpu_samples)
        peak = peak_memory_gb(self.device)
        if peak is not None:
            record["peak_mem_gb"] = peak
        return record

    def _one_off_clocks(self) -> dict[str, float]:
        """Start-up (process start to the first step) and compile warm-up, reported once per process."""
        if self.startup_reported:
            return {}
        self.startup_reported = True
        clocks = {"startup_seconds": self.startup_seconds}
        if self.cfg.train.compile and self.compile_seconds is not None:
            clocks["compile_seconds"] = self.compile_seconds
        return clocks

    def cut_short(self) -> bool:
        """max_steps ended training inside an epoch: that epoch stays unfinished (no epoch file, mid-epoch last.pt).

        A budget that lands exactly on an epoch's last batch completes that epoch.
        """
        t = self.cfg.train
        return (bool(t.max_steps) and self.counters.step >= t.max_steps
                and self.loader.taken < len(self.loader))

    def save(self, record: dict[str, Any], t_epoch: float) -> None:
        """After an epoch: best.pt when validation improved, epoch_NN.pt, last.pt; log the record."""
        t, s, epoch = self.cfg.train, self.counters, record["epoch"]
        t_save = time.perf_counter()
        metric = record.get("bleu") if t.best_metric == "bleu" else record["val_loss"]
        improved = metric is not None and (s.best_metric is None or (
            metric > s.best_metric if t.best_metric == "bleu" else metric < s.best_metric))
        if improved:
            s.best_metric, s.best_epoch = float(metric), epoch
        cut_short = self.cut_short()
        targets = ([self.run.best] if improved else []) + ([] if cut_short else [self.run.epoch(epoch)])
        s.wall_seconds += t_save - t_epoch  # before the checkpoint, so last.pt holds it
        record["wall_seconds"] = s.wall_seconds
        self._save_checkpoints(record, mid_epoch=cut_short, weights_to=targets, t_save=t_save)
        if self.info.is_main and t.keep_last_epochs and not cut_short:
            self.run.prune_epochs(keep_after=epoch - t.keep_last_epochs)
        bleu = f" | val BLEU {record['bleu']:.2f}" if "bleu" in record else ""
        reached = (f" | target {t.target_bleu:g} reached at epoch {s.target_epoch} ({s.target_seconds / 60:.1f} min)"
                   if s.target_epoch is not None else "")
        self.log(f"epoch {epoch}/{t.epochs} | step {s.step} | train loss {record['train_loss']:.4f} | "
                 f"val loss {record['val_loss']:.4f}{bleu} | {record['seconds']:.1f} s | clocks: training "
                 f"{s.train_seconds / 60:.1f} min, epochs {s.wall_seconds / 60:.1f} min{reached}"
                 f"{format_gpu(self.gpu_samples[-1] if self.gpu_samples else {})}")

    def _save_checkpoints(self, record: dict[str, Any], mid_epoch: bool, weights_to: Sequence[Path] = (),
                          t_save: float | None = None) -> None:
        """Queue last.pt (and the weights alone to `weights_to`) on the background writer; rank 0 writes."""
        if not weights_finite(self.model):  # a last line of defence: never overwrite good files with broken weights
            raise TrainingDiverged(f"training diverged: the weights are not finite at step {self.counters.step}; "
                                   "nothing was saved from them. Lower train.lr_factor or set train.clip_grad_norm")
        resumable = self.state.state_dict(mid_epoch=mid_epoch)  # a collective: every rank takes part
        self.saved_step = self.counters.step
        if not self.info.is_main:
            return
        common = {"config": self.cfg_dict, "text": self.text_state}
        weights = {**common, "model": resumable["model"], "train_state": resumable["train_state"]}
        jobs = ([(weights, weights_to)] if weights_to else []) + [({**common, **resumable}, [self.run.last])]
        self.writer.save(*jobs)
        if record:
            if t_save is not None:  # copying the weights and waiting for the previous write, not the write itself
                record["checkpoint_seconds"] = time.perf_counter() - t_save
            self.record(record)

    def finish(self) -> dict[str, Any]:
        """Charts; the best (or averaged) weights scored on val and test; a few example translations."""
        if self.info.is_main:
            _write_charts(self.run, self.log)
        found_best = self._use_weights(self.run.best)
        averaged = self._average_last_epochs()
        s = self.counters
        results: dict[str, Any] = {"best_epoch": s.best_epoch, "best_metric": s.best_metric, "steps": s.step,
                                   "train_seconds": s.train_seconds, "wall_seconds": s.wall_seconds}
        if self.cfg.train.target_bleu:
            results.update(target_bleu=self.cfg.train.target_bleu, target_epoch=s.target_epoch,
                           target_seconds=s.target_seconds)
        chosen = f"best.pt (epoch {s.best_epoch})" if found_best else "the final weights"
        if self.task.name == "copy":
            k = self.task.score(self.model, self.device)["exact_copies"]
            self.log(f"exact copies: {k}/100")
            results["exact_copies"] = k
        elif self.cfg.train.final_eval:
            self._final_scores(results, chosen, self.run.best if found_best else self.run.last, averaged)
        results["seconds"] = time.perf_counter() - self.t_start
        target = ""
        if self.cfg.train.target_bleu:
            target = (f"; val BLEU {self.cfg.train.target_bleu:g} reached at epoch {s.target_epoch} after "
                      f"{s.target_seconds / 60:.1f} min of training" if s.target_epoch is not None else
                      f"; val BLEU {self.cfg.train.target_bleu:g} not reached")
        self.log(f"done in {results['seconds']:.1f} s ({s.train_seconds / 60:.1f} min of training steps){target}; "
                 f"run directory {self.run.path}")
        return results

    def _use_weights(self, path: Path) -> bool:
        """Load `path`'s weights on rank 0 and give them to every rank; False when rank 0 has no such file."""
        found = [self.info.is_main and path.is_file()]
        if self.info.distributed:
            dist.broadcast_object_list(found, src=0)
        if found[0]:
            if self.info.is_main:
                self.model.load_state_dict(load_checkpoint(path, map_location=self.device)["model"])
            _broadcast_weights(self.model)
        return found[0]

    def _average_last_epochs(self) -> Path | None:
        """Average the newest `train.average_last` epoch files into avg.pt (rank 0); None if off or too few."""
        n = self.cfg.train.average_last
        if n < 2:
            return None
        paths = [path for _, path in self.run.epoch_files()[-n:]]
        enough = [len(paths) >= n]
        if self.info.distributed:
            dist.broadcast_object_list(enough, src=0)
        if not enough[0]:
            self.log(f"train.average_last={n} but only {len(paths)} epoch checkpoints exist; not averaging")
            return None
        if self.info.is_main:
            with writing(self.run.avg):
                save_checkpoint(average_checkpoints(paths), self.run.avg)
            self.log(f"averaged {', '.join(p.name for p in paths)} into {self.run.avg}")
        return self.run.avg

    def _final_scores(self, results: dict[str, Any], chosen: str, chosen_file: Path, averaged: Path | None) -> None:
        """Val BLEU of the chosen weights (best.pt, or avg.pt if it scores higher), then greedy and beam
        BLEU on test (or, with train.score_test=false, beam on val: settings are chosen on val alone)."""
        score, t, beam_size = self.task.score, self.cfg.train, self.cfg.decode.beam_size
        val = score(self.model, self.device, "val", amp_dtype=self.amp_dtype)
        if averaged is not None:
            kept = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self._use_weights(averaged)
            val_avg = score(self.model, self.device, "val", amp_dtype=self.amp_dtype)
            self.log(f"val BLEU: best.pt {val['bleu']:.2f} | {averaged.name} (last {t.average_last} "
                     f"epochs averaged) {val_avg['bleu']:.2f}")
            if val_avg["bleu"] > val["bleu"]:
                val, chosen, chosen_file = val_avg, averaged.name, averaged
            else:
                self.model.load_state_dict(kept)
        s = self.counters
        record: dict[str, Any] = {"kind": "final", "step": s.step, "checkpoint": chosen,
                                  "checkpoint_file": chosen_file.name, "val_bleu": val["bleu"],
                                  "bleu_signature": val["bleu_signature"], "train_seconds": s.train_seconds,
                                  "target_epoch": s.target_epoch, "target_seconds": s.target_seconds}
        shown = val
        if t.score_test:
            shown = test = score(self.model, self.device, "test", amp_dtype=self.amp_dtype)
            record["test_bleu"] = test["bleu"]
        self.log(f"{chosen}: val BLEU {val['bleu']:.2f}"
                 + (f" | test BLEU {record['test_bleu']:.2f}" if t.score_test else " (test not scored)")
                 + f" (greedy; {val['bleu_signature']})")
        if beam_size > 1:
            split = "test" if t.score_test else "val"
            beam = score(self.model, self.device, split, beam_size=beam_size, amp_dtype=self.amp_dtype)
            record[f"{split}_bleu_beam{beam_size}"] = beam["bleu"]
            self.log(f"{chosen}: {split} BLEU {beam['bleu']:.2f} (beam {beam_size}, alpha {self.cfg.decode.alpha})")
        results.update({key: v for key, v in record.items() if key.endswith("bleu") or "_beam" in key},
                       bleu_signature=val["bleu_signature"], final_checkpoint=chosen)
        if self.info.is_main:
            from .evaluation import check_outputs

            split = self.task.data.splits["test" if t.score_test else "val"]
            self.log(check_outputs(split.src_text, split.tgt_text, shown["hypotheses"], n=3))
            self.record(record)


def train_worker(cfg: Config) -> dict[str, Any]:
    """Train one rank (of one or many, under torchrun) from a validated config; return the final figures.

    Builds data, model, loss, optimizer and schedule; trains epoch by epoch; evaluates validation
    loss every epoch and validation BLEU every `train.bleu_every` epochs; keeps `best.pt`,
    `last.pt` and `epoch_NN.pt`; finally scores the test split with the best weights and shows a
    few translations (or, for the copy task, counts exact copies).
    """
    info, device = init_distributed(cfg.train.device)
    try:
        run = RunDir(cfg.run_dir())
        plan, last = run.plan(cfg)  # on every rank, so every rank decides (or fails) alike ...
        barrier()  # ... before rank 0 starts writing there
        if plan == "finished":
            s = last["train_state"]
            print0(f"{run.path} holds a finished run ({s['epoch']} epochs, {s['step']} steps) and "
                   "train.resume=auto leaves it as it is; train again with train.overwrite=true or another "
                   "train.out_dir, or raise train.epochs to continue it")
            return {"finished": True, "steps": s["step"]}
        return Trainer(cfg, info, device, plan, last).fit()
    except RuntimeError as exc:
        if info.distributed and _lost_a_rank(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DistributedError(
                f"rank {info.rank} lost contact with another rank ({first[:200]}); under torchrun --max-restarts "
                "the job restarts and continues from last.pt, otherwise rerun the same command to continue") from None
        raise
    finally:
        cleanup()


def _lost_a_rank(exc: RuntimeError) -> bool:
    """Whether a collective failed because a peer went away (gloo/NCCL errors are RuntimeErrors)."""
    text = str(exc)
    return isinstance(exc, dist.DistError) or any(
        marker in text for marker in ("Connection reset", "Connection closed", "Broken pipe", "gloo", "NCCL"))


def _write_charts(run: RunDir, log: Log) -> None:
    """Loss / learning-rate / BLEU curves from metrics.jsonl, as HTML and PNG (best effort)."""
    try:
        from .visualization import save_chart, training_curves_chart

        chart = training_curves_chart(run.metrics)
        save_chart(chart, run.charts / "training_curves")
    except Exception as exc:  # charts are a convenience: never lose a finished run over them
        log(f"warning: could not write charts ({type(exc).__name__}: {exc})")
