"""The Trainer behind `train_worker`: one rank's run built from a config (fit / train epoch / validate / save).

The loop itself (`train_step`, `run_epoch`) is the core's (`annotated_transformer.loop`); the parts
a practical run adds live beside this file: checkpointer.py (the run's checkpoint files, in the format of
checkpoints.py), resume.py (the run state and signals), progress.py (the log lines, time left, the slow-run warning),
run_end.py (charts, final scores, the translate command), run_dir.py, distributed.py, tasks.py (Multi30k or
the copy task), metrics.py (records, TensorBoard, GPU samples).
"""

from __future__ import annotations

import math
import random
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ..config import Config, config_to_dict
from ..runtime.errors import DistributedError, TrainingDiverged
from ..decode.static import validation_step
from ..extensions.builder import build_ema, build_training
from ..loop import TrainState
from .loss_meter import LossMeter
from .train_loop import LoopHooks, evaluate_loss, train_loop
from ..runtime.model_flops import train_step_flops
from . import progress
from .checkpointer import Checkpointer, improves
from .distributed import (RESULT, DistInfo, barrier, cleanup, close_run_log, init_distributed, open_run_log, print0,
                          result_lines)
from .metrics import Metrics
from .progress import epoch_line, speed_warning, start_line
from .resume import RunState, StopSignal
from .run_dir import RunDir, check_same_tokenizer, tokenizer_hash
from .run_end import finish
from .schedules import build_scheduler
from .tasks import build_task, task_fingerprint
from .tensorboard_log import summary_writer_class


def wrap_model(step_model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """The module the training step calls: DDP around `build_training`'s step model (compiled or not) when
    distributed.

    DDP must be the outer wrapper: `train_step` finds it with isinstance to skip the gradient
    all-reduce (`no_sync`) on all but the last micro-batch; torch.compile(DDP(...)) would hide it.
    """
    if info.distributed:
        return DDP(step_model, device_ids=[device.index] if device.type == "cuda" else None)
    return step_model


class Trainer:
    """One rank's training run: built from a config, then `fit()`.

    The loop reads like the paper's training section: for each epoch, `train_step` over its
    batches (`train_loop`), then `validate` and `save`; at the end `finish` (averaging, final scores,
    examples).
    """

    def __init__(self, cfg: Config, info: DistInfo, device: torch.device, start_mode: str = "start",
                 last: dict[str, Any] | None = None, run: RunDir | None = None) -> None:
        self.cfg, self.info, self.device, self.log = cfg, info, device, print0
        self.t_start = time.perf_counter()
        self.run = run if run is not None else RunDir(cfg.run_dir())  # train_worker's, which holds its lock
        if cfg.train.tensorboard and info.is_main:
            summary_writer_class()  # a missing package is an error before anything is written
        if info.is_main:
            self.run.prepare(cfg, start_mode, self.log)
            open_run_log(self.run.train_log)  # from here on rank 0's lines go to train.log too
        barrier()
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.task = build_task(cfg, info, log=self.log)
        text_state = self.task.text.state_dict() if self.task.text is not None else None
        if start_mode == "resume":  # before vocab/ is written: the weights learned the ids of last.pt's tokenizer
            check_same_tokenizer((last or {}).get("text"), text_state, self.run.last)
        if info.is_main and self.task.text is not None:
            self.run.save_text(self.task.text)
        self.model, self.loss_compute, self.objective, self.optimizer, self.amp_dtype, step_model = build_training(
            cfg, self.task.src_vocab_size, self.task.tgt_vocab_size, self.task.pad, device)  # with the speed plan
        if info.rank:  # dropout draws differ between ranks; the weights above were drawn alike on every rank
            torch.manual_seed(cfg.train.seed + info.rank)
        self.ema = build_ema(cfg, self.model, self.optimizer)  # None unless ema.decay > 0
        self.loader = self.task.train_loader(pin_memory=device.type == "cuda")
        self.total_steps = cfg.train.total_steps(len(self.loader))  # the run's optimizer steps, all epochs
        self.scheduler = build_scheduler(self.optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup,
                                         cfg.train.schedule, self.total_steps, cfg.train.final_lr_ratio,
                                         lr_on_device=cfg.train.compile == "captured")
        # validation on the training batches' kind of shapes: with static shapes, a fixed-shape decoder step
        self.val_batches = self.task.val_batches(static=self.loader.static_shapes)
        self.val_step = validation_step(cfg.train.compile) if self.loader.static_shapes else None
        self.run_state = RunState(TrainState(), self.model, self.optimizer, self.scheduler, self.loader,
                              LossMeter(device), info.rank, self.ema)
        self.train_state, self.counters = self.run_state.train_state, self.run_state.counters
        data = getattr(getattr(self.task, "data", None), "stats", {}).get("fingerprint")
        # what every checkpoint file carries; the data's fingerprint is what a resume compares first
        common = {"config": config_to_dict(cfg), "text": text_state,
                  "data": None if data is None else {**data, "tokenizer": tokenizer_hash(text_state)}}
        self.checkpoints = Checkpointer(self.run, self.run_state, info, common)
        self.mid_epoch = self.checkpoints.resume(last, self.log) if start_mode == "resume" else False
        self.train_model = wrap_model(step_model, info, device)
        self.stopper = StopSignal()
        self.metrics = Metrics(self.run, device, info.is_main, cfg.train.tensorboard, cfg.train.compile, self.t_start)
        self.step_clock = 0.0  # when the current stretch of timed optimizer steps began
        # (step, train_seconds, wall_seconds, tokens) when fit began, and whether the early warning is settled
        self.speed_mark: tuple[int, float, float, int] = (0, 0.0, 0.0, 0)
        self.speed_checked = not info.is_main
        self.speed_due = math.inf  # when to look between log lines (perf_counter), in a slow first epoch

    def done(self) -> bool:
        """Training is over when the epochs are done or the step budget is spent."""
        c = self.counters
        return self.cfg.train.finished(c.epoch, self.train_state.step, c.target_epoch is not None)

    def fit(self) -> dict[str, Any]:
        """Train epoch by epoch until done; a signal saves last.pt and stops; then finish."""
        m = self.model
        self.log(start_line(self))
        s, c = self.train_state, self.counters
        self.speed_mark = (s.step, c.train_seconds, c.wall_seconds, s.tokens)
        self.stopper.install()
        self.metrics.started({"step": self.train_state.step, "params": m.num_parameters(), "device": str(self.device),
                              "world_size": self.info.world_size, "threads": torch.get_num_threads(),
                              "precision": str(self.amp_dtype or "fp32")})
        try:
            while not self.done():
                epoch, t_epoch = self.counters.epoch, time.perf_counter()
                train_loss = self.train_epoch()
                if not self.stopping and self.info.distributed:  # a signal since the last comparison
                    self.stopping = self.stopper.stop_now(True, self.info.rank, force=True)
                if self.stopping:
                    self.counters.wall_seconds += time.perf_counter() - t_epoch
                    return self.stop(epoch)
                record = self.validate(epoch, train_loss, time.perf_counter() - t_epoch)
                self.save(record, t_epoch)
            self.stopper.restore()  # from here on Ctrl-C interrupts at once
            self.checkpoints.wait()  # the best model file on disk before finish reads it back
            return self.finish()
        except TrainingDiverged as exc:
            raise TrainingDiverged(f"{exc}, then {self.checkpoints.restart_hint()}") from None
        finally:
            self.stopper.restore()
            self.checkpoints.wait()  # every checkpoint on disk before the process exits
            self.metrics.close()

    def train_epoch(self) -> float:
        """One epoch (or the rest of a resumed one) of `train_step`; returns its mean training loss."""
        t, t_data = self.cfg.train, 0.0
        if not self.mid_epoch:
            self.loader.set_epoch(self.counters.epoch)
            self.run_state.meter = LossMeter(self.device)
            t_data = getattr(self.loader, "resegment_seconds", 0.0)  # resegmenting is training time too
            note = getattr(getattr(self.loader, "resegment", None), "epoch_note", "")  # a resegmentation's word
            if note and self.info.is_main:
                self.log(f"epoch {self.counters.epoch + 1}: {note}")
        self.mid_epoch, self.stopping = False, False
        first_batch = self.loader.taken  # 0, or where a resumed epoch continues
        steps = -(-len(self.loader) // t.accum_steps)  # the last group may be short
        bar = tqdm(total=steps, desc=f"epoch {self.counters.epoch + 1}", leave=False, dynamic_ncols=True,
                   disable=True if not (self.info.is_main and t.progress) else None)  # None: off without a TTY
        self.metrics.new_epoch()
        self.step_clock = time.perf_counter()
        self.run_state.meter.start_clock()
        self._look_again(after=self.step_clock)
        with bar:
            loss = train_loop(
                self.loader, self.train_model, self.loss_compute, self.optimizer, self.scheduler, self.train_state,
                accum_iter=t.accum_steps, device=self.device, amp_dtype=self.amp_dtype,
                clip_grad_norm=t.clip_grad_norm, max_steps=t.max_steps, log_every=t.log_every,
                hooks=LoopHooks(log=self.log if self.info.is_main else None, on_log=self._on_log,
                                should_stop=self._should_stop, progress=None if bar.disable else bar),
                meter=self.run_state.meter, objective=self.objective, epoch=self.counters.epoch)
        self.counters.train_seconds += time.perf_counter() - self.step_clock + t_data
        self.counters.flops += self.compute(first_batch, max(first_batch, self.loader.taken))
        return loss

    def compute(self, start: int, stop: int) -> float:
        """Model FLOPs of this epoch's batches start..stop-1 on all ranks: the benchmark's matmul count of the
        sentences' real lengths (the dense model's), times the extra passes of the training objective."""
        m = self.cfg.model
        src, tgt = self.loader.lengths_served(start, stop)
        flops = train_step_flops(m.d_model, m.d_ff, m.N, self.task.tgt_vocab_size, src, tgt - 1, m.N_dec or None)
        return flops * getattr(self.objective, "compute_factor", 1.0)

    def _should_stop(self) -> bool:
        """After each step: a signal arrived (under torchrun on any rank, agreed by all at the same step)."""
        if self.metrics.compile_seconds is None:  # the first step of a compiled model: compile, not training
            self.metrics.compile_seconds = time.perf_counter() - self.step_clock
            self.step_clock = time.perf_counter()
            self._look_again(after=self.step_clock)
        if time.perf_counter() >= self.speed_due:  # slow steps: a minute passed without a log line
            self._warn_if_slow(at_epoch_end=False)
        self.checkpoints.check()  # a failed background write stops the run within a step, not an epoch later
        self.stopping = self.stopper.stop_now(self.info.distributed, self.info.rank)
        return self.stopping

    def _on_log(self, figures: dict[str, float]) -> None:
        """A log line's figures (with the objective's, when one is on) go to the metrics; a long run says so."""
        if self.objective is not None:
            figures = {**figures, **self.objective.figures()}
        self.metrics.on_log(figures, self.counters.epoch + 1)
        self._warn_if_slow(at_epoch_end=False)

    def _warn_if_slow(self, at_epoch_end: bool) -> None:
        """Rank 0, early in a run (at the log lines of its first epoch and once a minute between them, then at
        that epoch's end): one warning line when training will take longer than progress.SLOW_RUN_SECONDS, naming a
        quicker config where there is one."""
        if self.speed_checked:
            return
        line = speed_warning(self, at_epoch_end)
        if line is not None:
            self.log(line)  # print0 writes above the progress bar while it shows
        self.speed_checked = line is not None or at_epoch_end
        self._look_again(after=time.perf_counter())

    def _look_again(self, after: float) -> None:
        """The next look between log lines: progress.SPEED_AFTER_SECONDS after `after`, or never once settled."""
        self.speed_due = math.inf if self.speed_checked else after + progress.SPEED_AFTER_SECONDS

    def stop(self, epoch: int) -> dict[str, Any]:
        """A signal stopped training inside `epoch`: save last.pt with the data position, say so, return."""
        self.checkpoints.save(mid_epoch=True)
        self.checkpoints.wait()  # last.pt on disk ...
        barrier()  # ... before any rank exits: torchrun stops the others when the first one exits
        name = signal.Signals(self.stopper.signum).name if self.stopper.signum else "a signal on another rank"
        print0(f"stopped by {name} in epoch {epoch + 1} at step {self.train_state.step}; saved {self.run.last}; "
               "run the same command again to continue (train.resume=auto)", level=RESULT)
        return {"stopped_by": self.stopper.signum or signal.SIGTERM}

    def validate(self, epoch: int, train_loss: float, seconds: float) -> dict[str, Any]:
        """Validation loss (and BLEU when due) after `epoch`; the epoch's metrics record with its clocks."""
        t, c, t_eval = self.cfg.train, self.counters, time.perf_counter()
        if not self.run_state.cut_short(t.max_steps):
            c.epoch = epoch + 1
        with self.evaluated_weights():
            val_loss = evaluate_loss(self.val_batches, self.model, self.loss_compute, device=self.device,
                                     amp_dtype=self.amp_dtype)
            scored = self.task.score(self.model, self.device, "val", beam_size=1, amp_dtype=self.amp_dtype,
                                     static=self.val_step) if self._bleu_due(epoch) else None
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": self.train_state.step,
                                  "train_loss": train_loss, "val_loss": val_loss, "seconds": seconds}
        if scored is not None:
            record.update(bleu=scored["bleu"], bleu_signature=scored["bleu_signature"])
            if t.target_bleu and c.target_epoch is None and scored["bleu"] >= t.target_bleu:
                c.target_epoch, c.target_seconds, c.target_flops = epoch + 1, c.train_seconds, c.flops
        record.update(train_seconds=c.train_seconds, train_flops=c.flops, eval_seconds=time.perf_counter() - t_eval)
        if c.target_epoch is not None:
            record.update(target_bleu=t.target_bleu, target_epoch=c.target_epoch, target_seconds=c.target_seconds,
                          target_flops=c.target_flops)
        return {**record, **self.metrics.epoch_figures()}

    def _bleu_due(self, epoch: int) -> bool:
        """Validation BLEU after `epoch` (from 0): every train.bleu_every epochs and after the last (translation)."""
        every = self.cfg.train.bleu_every
        return self.task.name == "translation" and bool(every) and ((epoch + 1) % every == 0 or self.done())

    def evaluated_weights(self) -> AbstractContextManager[None]:
        """The weights validation scores: the raw ones, or with `ema.decay` on their average swapped in."""
        return self.ema.swapped_in() if self.ema is not None else nullcontext()

    def save(self, record: dict[str, Any], t_epoch: float) -> None:
        """After an epoch: the best model file when validation improved, epoch_NN, last.pt; log the record."""
        t, c, epoch = self.cfg.train, self.counters, record["epoch"]
        t_save = time.perf_counter()
        metric = record.get("bleu") if t.best_metric == "bleu" else record["val_loss"]
        improved = improves(metric, c.best_metric, t.best_metric)
        if improved:
            c.best_metric, c.best_epoch = float(metric), epoch
        cut_short = self.run_state.cut_short(t.max_steps)
        targets = ([self.run.best] if improved else []) + ([] if cut_short else [self.run.epoch(epoch)])
        c.wall_seconds += t_save - t_epoch  # before the checkpoint, so last.pt holds it
        record["wall_seconds"] = c.wall_seconds
        self.checkpoints.save(mid_epoch=cut_short, weights_to=targets)
        if self.info.is_main:  # copying the weights and waiting for the previous write, not the write itself
            self.metrics.record({**record, "checkpoint_seconds": time.perf_counter() - t_save})
        if self.info.is_main and t.keep_last_epochs and not cut_short:
            self.run.prune_epochs(keep_after=epoch - t.keep_last_epochs)
        self._warn_if_slow(at_epoch_end=True)
        self.log(epoch_line(record, self.train_state, c, t, self.total_steps) + self.metrics.gpu_line())

    def finish(self) -> dict[str, Any]:
        """Charts, final scores and example translations (run_end.finish): the run's result, which --quiet shows."""
        with result_lines():
            return finish(self)


def train_worker(cfg: Config) -> dict[str, Any]:
    """Train one rank (of one or many, under torchrun) from a validated config; return the final figures.

    Builds data, model, loss, optimizer and schedule; trains epoch by epoch; computes validation
    loss every epoch and validation BLEU every `train.bleu_every` epochs; keeps the best model file,
    `last.pt` and the last epochs' model files; finally scores the test split with the best weights and shows a
    few translations (or, for the copy task, counts exact copies). Rank 0's lines go to the run's train.log too,
    the error that ends a run among them.
    """
    with run_log_closed():
        info, device = init_distributed(cfg.train.device)
        run = RunDir(cfg.run_dir())
        try:
            # every rank decides (or fails) alike before rank 0 writes
            start_mode, last = run.open(cfg, info, data=task_fingerprint(cfg))
            if start_mode == "finished":
                s = last["train_state"]
                print0(f"{run.path} holds a finished run ({s['epoch']} epochs, {s['step']} steps) and "
                       "train.resume=auto leaves it as it is; train again with train.overwrite=true or another "
                       "train.out_dir, or raise train.epochs to continue it", level=RESULT)
                return {"finished": True, "steps": s["step"]}
            return Trainer(cfg, info, device, start_mode, last, run).fit()
        except RuntimeError as exc:
            if info.distributed and _lost_a_rank(exc):
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise DistributedError(
                    f"rank {info.rank} lost contact with another rank ({first[:200]}); under torchrun --max-restarts "
                    "the job restarts and continues from last.pt, otherwise rerun the same command to continue"
                ) from None
            raise
        finally:
            run.unlock()  # after fit's last checkpoint is on disk (fit waits for the writer)
            cleanup()


@contextmanager
def run_log_closed() -> Iterator[None]:
    """Rank 0's train.log (which the Trainer opens) is closed when the block ends; an error that ends it is
    written to it first."""
    try:
        yield
    except BaseException as exc:
        close_run_log(exc)
        raise
    finally:
        close_run_log()


def _lost_a_rank(exc: RuntimeError) -> bool:
    """Whether a collective failed because a peer went away (gloo/NCCL errors are RuntimeErrors)."""
    text = str(exc)
    return isinstance(exc, dist.DistError) or any(
        marker in text for marker in ("Connection reset", "Connection closed", "Broken pipe", "gloo", "NCCL"))
