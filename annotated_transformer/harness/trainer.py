"""The Trainer behind `train_worker`: one rank's run built from a config (fit / train epoch / validate / save).

The loop itself (`train_step`, `run_epoch`) is the core's (`annotated_transformer.loop`); the parts
a practical run adds live beside this file: checkpointer.py (the run's checkpoint files, in the format of
checkpoints.py), resume.py (the run state and signals), progress.py (the log lines, time left, the warnings of
a slow run and of shared CPU cores), run_end.py (charts, final scores, the translate command), run_dir.py,
distributed.py, tasks.py (translation, on Multi30k or your own files, or the copy task), metrics.py (records,
TensorBoard, GPU samples).
"""

from __future__ import annotations

import functools
import math
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ..config import Config, config_to_dict
from ..runtime.errors import (DistributedError, Interrupted, Terminated, TrainingDiverged, UserError,
                              ignore_same_keypress, terminate_raises)
from ..decode.static import validation_step
from ..extensions.builder import build_training
from ..fast.plan import check_compile_mode
from ..loop import TrainState
from .loss_meter import LossMeter
from .train_loop import LoopHooks, evaluate_loss, train_loop
from ..runtime.device import resolve_amp_dtype
from ..runtime.model_flops import train_step_flops
from . import progress
from .checkpointer import Checkpointer, improves
from .distributed import (RESULT, DistInfo, barrier, cleanup, close_run_log, early_lines_kept, init_distributed,
                          open_run_log, print0, ranks_agree, result_lines)
from .metrics import Metrics
from .progress import CpuShare, epoch_line, finished_line, log_line_end, speed_warning, start_line, step_line
from .resume import RunState, StopSignal
from .run_dir import RunDir, check_same_tokenizer, tokenizer_hash
from .run_end import finish
from .schedules import build_scheduler
from .tasks import TaskFiles
from .tensorboard_log import summary_writer_class


def every(step: int, n: int) -> bool:
    """Whether `step` is a multiple of a cadence `n` (0: never)."""
    return bool(n) and step % n == 0


def wrap_model(step_model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """The module the training step calls: DDP around `build_training`'s step model (compiled or not) when
    distributed.

    DDP must be the outer wrapper: `train_step` finds it with isinstance to skip the gradient
    all-reduce (`no_sync`) on all but the last micro-batch; torch.compile(DDP(...)) would hide it.
    """
    if info.distributed:
        return DDP(step_model, device_ids=[device.index] if device.type == "cuda" else None)
    return step_model


@contextmanager
def nothing_trained_yet() -> Iterator[None]:
    """A Ctrl-C inside (joining the other ranks, taking the run's folder, building its data and model: before `fit`
    takes Ctrl-C itself and saves last.pt) is one line saying that nothing is lost and how to go on, exit 130 (an
    `Interrupted`, still a KeyboardInterrupt)."""
    try:
        yield
    except KeyboardInterrupt:
        ignore_same_keypress()  # its second copy (uv run's) must not cut short the clean-up and this line
        raise Interrupted("interrupted before training went on; nothing of the run is lost: run the same command to "
                          "start it, or to continue it from its last.pt") from None


class Trainer:
    """One rank's training run: built from a config, then `fit()`.

    The loop reads like the paper's training section: for each epoch, `train_step` over its
    batches (`train_loop`), then `validate` and `save`; at the end `finish` (averaging, final scores,
    examples). A long run also validates and saves every N steps inside an epoch (`at_step`: the paper saved a
    checkpoint every 10 minutes and averaged the last 5).
    """

    @nothing_trained_yet()
    def __init__(self, cfg: Config, info: DistInfo, device: torch.device, run: RunDir, start_mode: str = "start",
                 last: dict[str, Any] | None = None, files: TaskFiles | None = None) -> None:
        self.cfg, self.info, self.device, self.log = cfg, info, device, print0
        self.t_start = time.perf_counter()
        self.run = run  # opened (RunDir.open: locked, decided, made the run's) by train_worker, which unlocks it
        if info.is_main:
            open_run_log(self.run.train_log)  # from here on rank 0's lines go to train.log too
        barrier()
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        # `files`: what the resume's check opened, or the start built, not read again
        self.task = (files or TaskFiles(cfg)).build(info, cuda=device.type == "cuda", log=self.log)
        text_state = self.task.text.state_dict() if self.task.text is not None else None
        if start_mode == "resume":  # the weights learned the ids of last.pt's tokenizer
            check_same_tokenizer((last or {}).get("text"), text_state, self.run.last)
        # with the speed plan; ema is None unless ema.decay > 0
        (self.model, self.loss_compute, self.objective, self.optimizer, self.amp_dtype, step_model,
         self.ema) = build_training(cfg, self.task.src_vocab_size, self.task.tgt_vocab_size, self.task.pad, device)
        if info.rank:  # dropout draws differ between ranks; the weights above were drawn alike on every rank
            torch.manual_seed(cfg.train.seed + info.rank)
        self.loader = self.task.train_loader(pin_memory=device.type == "cuda")
        self.total_steps = cfg.train.total_steps(len(self.loader))  # the run's optimizer steps, all epochs
        self.scheduler = build_scheduler(self.optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup,
                                         cfg.train.schedule, self.total_steps, cfg.train.final_lr_ratio,
                                         lr_on_device=cfg.train.compile == "captured")
        # validation on the training batches' kind of shapes: with static shapes, a fixed-shape decoder step
        self.val_batches = self.task.val_batches(static=self.loader.static_shapes)
        self.val_step = validation_step(cfg.train.compile, device) if self.loader.static_shapes else None
        self.run_state = RunState(TrainState(), self.model, self.optimizer, self.scheduler, self.loader,
                              LossMeter(device), info.rank, self.ema)
        self.train_state, self.counters = self.run_state.train_state, self.run_state.counters
        data = getattr(getattr(self.task, "data", None), "stats", {}).get("fingerprint")
        # what every checkpoint file carries; the data's fingerprint is what a resume compares first
        common = {"config": config_to_dict(cfg), "text": text_state,
                  "data": None if data is None else {**data, "tokenizer": tokenizer_hash(text_state)}}
        self.checkpoints = Checkpointer(self.run, self.run_state, info, common)
        self.mid_epoch = self.checkpoints.resume(last, self.log) if start_mode == "resume" else False
        if info.is_main:  # after the resume's checks (its seed, processes, batches): a refused one changes nothing
            self.run.save_settings(cfg, self.task.text)
        self.train_model = wrap_model(step_model, info, device)
        self.stopper = StopSignal()
        self.metrics = Metrics(self.run, device, info.is_main, cfg.train.tensorboard, cfg.train.compile, self.t_start)
        self.step_clock = 0.0  # when the current stretch of timed optimizer steps began
        self.wall_clock = 0.0  # since when the wall time is not yet in counters.wall_seconds (perf_counter)
        self.flops_from = 0  # the first batch of this epoch whose FLOPs are not yet in counters.flops
        # (step, train_seconds, wall_seconds, tokens) when fit began, and whether the early warning is settled
        self.speed_mark: tuple[int, float, float, int] = (0, 0.0, 0.0, 0)
        self.speed_checked = not info.is_main
        self.speed_due = math.inf  # when to look between log lines (perf_counter), in a slow first epoch
        self.cpu_share = CpuShare(judged=device.type == "cpu" and not info.distributed)  # other programs' cores?

    @property
    def since(self) -> tuple[int, float]:
        """(step, training seconds) when this process began training: the time left goes at its own pace."""
        return self.speed_mark[0], self.speed_mark[1]

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
                epoch = self.counters.epoch
                t_epoch = self.wall_clock = time.perf_counter()
                train_loss = self.train_epoch()  # with `at_step` every train.val_every_steps / save_every_steps
                if not self.stopping and self.info.distributed:  # a signal since the last comparison
                    self.stopping = self.stopper.stop_now(True, self.info.rank, force=True)
                if self.stopping:
                    self.count_wall()
                    return self.stop(epoch)
                record = self.validate(epoch, train_loss, time.perf_counter() - t_epoch)
                self.save(record)
            # a stop that came in the last epoch's validation or save: before the final evaluation, not after it
            if self.stopper.stop_now(self.info.distributed, self.info.rank, force=True):  # every rank asks, once
                return self.stopped_before_end(self.stopper.signum)
            self.stopper.restore()  # from here on Ctrl-C interrupts at once
            try:
                with terminate_raises():
                    self.checkpoints.wait()  # the best model file on disk before finish reads it back
                    return self.finish()
            except (KeyboardInterrupt, Terminated) as stop:  # trained: the same command finishes it (no final record)
                return self.stopped_before_end(signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM)
        except TrainingDiverged as exc:
            raise TrainingDiverged(f"{exc}, then {self.checkpoints.restart_hint()}") from None
        finally:
            self.stopper.restore()
            self.checkpoints.wait()  # every checkpoint on disk before the process exits
            self.metrics.close()

    def train_epoch(self) -> float:
        """One epoch (or the rest of a resumed one) of `train_step`; returns its mean training loss."""
        t = self.cfg.train
        if not self.mid_epoch:
            self.loader.set_epoch(self.counters.epoch)
            self.run_state.meter = LossMeter(self.device)
            self.counters.train_seconds += getattr(self.loader, "resegment_seconds", 0.0)  # training time too
            note = getattr(getattr(self.loader, "resegment", None), "epoch_note", "")  # a resegmentation's word
            if note and self.info.is_main:
                self.log(f"epoch {self.counters.epoch + 1}: {note}")
        self.mid_epoch, self.stopping = False, False
        self.flops_from = self.loader.taken  # 0, or where a resumed epoch continues
        bar = tqdm(total=t.epoch_steps(len(self.loader)), desc=f"epoch {self.counters.epoch + 1}", leave=False,
                   dynamic_ncols=True, disable=True if not (self.info.is_main and t.progress) else None)  # None: no TTY
        self.metrics.new_epoch()
        self.step_clock = time.perf_counter()
        self.run_state.meter.start_clock()
        self._look_again(after=self.step_clock)
        self.cpu_share.start()
        with bar:
            loss = train_loop(
                self.loader, self.train_model, self.loss_compute, self.optimizer, self.scheduler, self.train_state,
                accum_iter=t.accum_steps, device=self.device, amp_dtype=self.amp_dtype,
                clip_grad_norm=t.clip_grad_norm, max_steps=t.max_steps, log_every=t.log_every,
                hooks=LoopHooks(log=self._log_line if self.info.is_main else None, on_log=self._on_log,
                                after_step=self._after_step, should_stop=self._should_stop,
                                progress=None if bar.disable else bar),
                meter=self.run_state.meter, objective=self.objective, epoch=self.counters.epoch)
        self.cpu_share.pause()
        self.count_training()
        return loss

    def count_training(self) -> None:
        """Add the steps since the last count to the training clock and the FLOPs: at an epoch's end, and before a
        validation or checkpoint inside one (which then hold them)."""
        now, taken = time.perf_counter(), max(self.flops_from, self.loader.taken)
        self.counters.train_seconds += now - self.step_clock
        self.counters.flops += self.compute(self.flops_from, taken)
        self.step_clock, self.flops_from = now, taken

    def count_wall(self, now: float | None = None) -> None:
        """Add the wall time since the last count (the epoch's start, or a checkpoint inside it) to the counters."""
        now = time.perf_counter() if now is None else now
        self.counters.wall_seconds += now - self.wall_clock
        self.wall_clock = now

    def compute(self, start: int, stop: int) -> float:
        """Model FLOPs of this epoch's batches start..stop-1 on all ranks: the benchmark's matmul count of the
        sentences' real lengths (the dense model's), times the extra passes of the training objective."""
        m = self.cfg.model
        src, tgt = self.loader.lengths_served(start, stop)
        flops = train_step_flops(m.d_model, m.d_ff, m.N, self.task.tgt_vocab_size, src, tgt - 1, m.N_dec or None)
        return flops * getattr(self.objective, "compute_factor", 1.0)

    def _after_step(self) -> None:
        """After each step: the compile step's clock, looks at the speed and the CPU's share, a failed background write,
        and at multiples of train.val_every_steps / save_every_steps inside an epoch `at_step` (an epoch's last step
        leaves both to the epoch's end, which follows)."""
        if self.metrics.compile_seconds is None:  # the first step of a compiled model: compile, not training
            self.metrics.compile_seconds = time.perf_counter() - self.step_clock
            self.step_clock = time.perf_counter()
            self._look_again(after=self.step_clock)
            self.cpu_share.start()  # compiling runs on one thread: not a share of the cores to judge
        if time.perf_counter() >= self.speed_due:  # slow steps: a minute passed without a log line
            self._warn_if_slow(at_epoch_end=False)
        shared = self.cpu_share.check()
        if shared is not None:
            self.log(shared)
        self.checkpoints.check()  # a failed background write stops the run within a step, not an epoch later
        t, step = self.cfg.train, self.train_state.step
        validate, save = every(step, t.val_every_steps), every(step, t.save_every_steps)
        if (validate or save) and not self.epoch_ends():
            self.at_step(validate, save)

    def epoch_ends(self) -> bool:
        """The step just taken is the epoch's last, or the run's (train.max_steps)."""
        max_steps = self.cfg.train.max_steps
        return self.loader.taken >= len(self.loader) or bool(max_steps and self.train_state.step >= max_steps)

    def _should_stop(self) -> bool:
        """After each step: a signal arrived (under torchrun on any rank, agreed by all at the same step)."""
        self.stopping = self.stopper.stop_now(self.info.distributed, self.info.rank)
        return self.stopping

    def _log_line(self, line: str) -> None:
        """Rank 0's log line, ending with the share of the run's steps done and the time left."""
        now = time.perf_counter()  # this epoch's wall and training seconds so far too
        wall = self.counters.wall_seconds + now - self.wall_clock
        train = self.counters.train_seconds + now - self.step_clock
        self.log(line + log_line_end(self.train_state, self.counters, self.cfg.train, self.total_steps, wall, train,
                                     self.since))

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

    def at_step(self, validate: bool, save: bool) -> None:
        """Inside an epoch: validation (as at an epoch's end, with the epoch's training loss so far; its metrics
        record and the best model file) and/or last.pt with the step's model file; then training goes on."""
        t, c, s = self.cfg.train, self.counters, self.train_state
        self.cpu_share.pause()
        self.count_training()  # the clocks and FLOPs up to this step, in the record and in last.pt
        t_eval = time.perf_counter()
        record: dict[str, Any] = {"kind": "step", "epoch": c.epoch + 1, "step": s.step}
        if validate:
            record.update(train_loss=self.run_state.meter.read_epoch(), **self.evaluate(self._bleu_due_at_step()),
                          train_seconds=c.train_seconds, train_flops=c.flops,
                          eval_seconds=time.perf_counter() - t_eval)
        t_save = time.perf_counter()
        targets = (self.best_file(record) if validate else []) + self.step_file()
        self.count_wall(t_save)
        record["wall_seconds"] = c.wall_seconds
        if save or targets:  # a better validation alone writes the best model file alone
            self.checkpoints.save(mid_epoch=True, weights_to=targets, last=save, then=self.pruning())
        if validate and self.info.is_main:
            self.metrics.record({**record, "checkpoint_seconds": time.perf_counter() - t_save})
        if validate:
            self.log(step_line(record, s, c, t, self.total_steps, self.since))
        self.train_model.train()  # validation left the model in eval mode
        self.step_clock = time.perf_counter()  # validating and saving are not training time
        self.run_state.meter.start_clock()
        self.cpu_share.start()

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
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": self.train_state.step,
                                  "train_loss": train_loss, **self.evaluate(self._bleu_due(epoch)), "seconds": seconds}
        if "bleu" in record and t.target_bleu and c.target_epoch is None and record["bleu"] >= t.target_bleu:
            c.target_epoch, c.target_seconds, c.target_flops = epoch + 1, c.train_seconds, c.flops
        record.update(train_seconds=c.train_seconds, train_flops=c.flops, eval_seconds=time.perf_counter() - t_eval)
        if c.target_epoch is not None:
            record.update(target_bleu=t.target_bleu, target_epoch=c.target_epoch, target_seconds=c.target_seconds,
                          target_flops=c.target_flops)
        return {**record, **self.metrics.epoch_figures()}

    def evaluate(self, bleu: bool) -> dict[str, Any]:
        """The validation loss, and with `bleu` greedy BLEU, of the weights validation scores."""
        with self.evaluated_weights():
            scores: dict[str, Any] = {"val_loss": evaluate_loss(self.val_batches, self.model, self.loss_compute,
                                                                device=self.device, amp_dtype=self.amp_dtype)}
            if bleu:
                scored = self.task.score(self.model, self.device, "val", beam_size=1, amp_dtype=self.amp_dtype,
                                         static=self.val_step)
                scores.update(bleu=scored["bleu"], bleu_signature=scored["bleu_signature"])
        return scores

    def _bleu_due(self, epoch: int) -> bool:
        """Validation BLEU after `epoch` (from 0): every train.bleu_every epochs and after the last (translation)."""
        n = self.cfg.train.bleu_every
        return self.task.name == "translation" and bool(n) and ((epoch + 1) % n == 0 or self.done())

    def _bleu_due_at_step(self) -> bool:
        """Validation BLEU at a validation inside an epoch: every train.bleu_every-th of them (translation)."""
        t = self.cfg.train
        return self.task.name == "translation" and every(self.train_state.step // t.val_every_steps, t.bleu_every)

    def evaluated_weights(self) -> AbstractContextManager[None]:
        """The weights validation scores: the raw ones, or with `ema.decay` on their average swapped in."""
        return self.ema.swapped_in() if self.ema is not None else nullcontext()

    def save(self, record: dict[str, Any]) -> None:
        """After an epoch: the best model file when validation improved, epoch_NN (and step_NNNNNNN on a
        train.save_every_steps step), last.pt; log the record."""
        t, c, epoch = self.cfg.train, self.counters, record["epoch"]
        t_save = time.perf_counter()
        cut_short = self.run_state.cut_short(t.max_steps)
        targets = self.best_file(record) + ([] if cut_short else [self.run.epoch(epoch)]) + self.step_file()
        self.count_wall(t_save)  # before the checkpoint, so last.pt holds it
        record["wall_seconds"] = c.wall_seconds
        old_epochs = epoch - t.keep_last_epochs if t.keep_last_epochs and not cut_short else None
        self.checkpoints.save(mid_epoch=cut_short, weights_to=targets, then=self.pruning(old_epochs))
        if self.info.is_main:  # copying the weights and waiting for the previous write, not the write itself
            self.metrics.record({**record, "checkpoint_seconds": time.perf_counter() - t_save})
        self._warn_if_slow(at_epoch_end=True)
        self.log(epoch_line(record, self.train_state, c, t, self.total_steps, self.since) + self.metrics.gpu_line())

    def best_file(self, record: dict[str, Any]) -> list[Path]:
        """[the best model file] when `record`'s validation beats the best so far (train.best_metric), which it
        becomes; else []."""
        t, c = self.cfg.train, self.counters
        metric = record.get("bleu") if t.best_metric == "bleu" else record["val_loss"]
        if not improves(metric, c.best_metric, t.best_metric):
            return []
        c.best_metric, c.best_epoch, c.best_step = float(metric), record["epoch"], record["step"]
        return [self.run.best]

    def step_file(self) -> list[Path]:
        """[this step's model file] on a multiple of train.save_every_steps, and at the run's last step (so that
        train.average_last averages the final weights too, whatever the cadence), else []."""
        step, n = self.train_state.step, self.cfg.train.save_every_steps
        return [self.run.step(step)] if every(step, n) or (n and self.done()) else []

    def pruning(self, old_epochs: int | None = None) -> Callable[[], None]:
        """What deletes older model files once this save's files are on disk (the checkpoint writer runs it, rank 0
        alone): the epoch files up to `old_epochs` (train.keep_last_epochs), and with a step file in this save
        the step files beyond train.keep_last_steps. Deleted before the new file landed, a full disk would
        leave neither."""
        keep, step, run, log = self.cfg.train.keep_last_steps, self.train_state.step, self.run, self.log
        prune_steps = bool(keep and self.step_file())

        def prune() -> None:
            try:
                if old_epochs is not None:
                    run.prune_epochs(keep_after=old_epochs)
                if prune_steps:
                    run.prune_steps(keep, newest=step)
            except UserError as exc:  # the new files are whole: an old one that stays is no reason to stop
                log(f"warning: {exc}; training goes on, the older model files stay")
        return prune

    def stopped_before_end(self, signum: int | None) -> dict[str, Any]:
        """Trained to its end, stopped before or in its final evaluation (`signum`: None for a signal on another
        rank): said, and the same command finishes it (no final record is written, so the run is not finished)."""
        name = signal.Signals(signum).name if signum else "a signal on another rank"
        print0(f"stopped by {name} at the end of training (step {self.train_state.step}), "
               f"before its final scores; the trained weights are saved in {self.run.path}; run the same command "
               "again to score them", level=RESULT)
        return {"stopped_by": signum or signal.SIGTERM}

    def finish(self) -> dict[str, Any]:
        """Charts, final scores and example translations (run_end.finish): the run's result, which --quiet shows."""
        with result_lines():
            return finish(self)


def train_worker(cfg: Config) -> dict[str, Any]:
    """Train one rank (of one or many, under torchrun) from a validated config; return the final figures.

    Builds data, model, loss, optimizer and schedule; trains epoch by epoch; computes validation loss every
    epoch (and every `train.val_every_steps` steps) and validation BLEU every `train.bleu_every` validations;
    keeps the best model file, `last.pt` and the last epochs' (and `train.save_every_steps` steps') model files;
    finally scores the test split with the best weights and shows a few translations (or, for the copy task,
    counts exact copies). Rank 0's lines go to the run's train.log too, the error that ends a run among them.
    """
    with run_log_closed():
        with nothing_trained_yet():  # under torchrun, waiting for the other ranks
            info, device = init_distributed(cfg.train.device)
        run, files = RunDir(cfg.run_dir()), TaskFiles(cfg, log=print0)
        try:
            with nothing_trained_yet():  # every rank decides (or fails) alike before rank 0 writes
                start_mode, last = run.open(cfg, info, data=files.resume_check, log=said_even_quiet,
                                            ready=functools.partial(ready_to_start, cfg, info, device, files, run))
            if start_mode == "finished":
                s = last["train_state"]
                print0(finished_line(run.path, s, cfg.train, mid_epoch=last.get("loader") is not None), level=RESULT)
                return {"finished": True, "steps": s.get("step", 0)}
            return Trainer(cfg, info, device, run, start_mode, last, files).fit()
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


def said_even_quiet(line: str) -> None:
    """A line of rank 0 that --quiet shows too (what train.overwrite deleted); a warning stays a warning."""
    print0(line, level=None if line.startswith("warning:") else RESULT)


def ready_to_start(cfg: Config, info: DistInfo, device: torch.device, files: TaskFiles, run: RunDir) -> None:
    """What a run checks, holding its folder's lock, before it writes or clears anything there, so that a run that
    cannot start writes nothing: the tensorboard package when train.tensorboard is on (rank 0, which writes its
    files), the compile mode and the precision on this device, and the data's files found. Before train.overwrite
    clears a run, its data is built too (kept for the run): a corpus or tokenizer that fails has deleted nothing.
    Under torchrun every rank builds it, as the ranks load data together."""
    with ranks_agree(info, "start"):  # before the ranks build the data together: a failure here stops them all
        if cfg.train.tensorboard and info.is_main:
            summary_writer_class()
        check_compile_mode(cfg.train.compile, device)
        resolve_amp_dtype(cfg.train.precision, device)  # bf16 on a GPU without it: refused before anything is cleared
        if info.is_main:
            files.locate()  # rank 0 downloads Multi30k when it is missing, once
    with ranks_agree(info, "find the data"):
        files.locate()  # the other ranks then find it (on rank 0: found already)
    if cfg.train.overwrite and (info.distributed or run.has_run()):
        files.build(info, cuda=device.type == "cuda", log=print0)


@contextmanager
def run_log_closed() -> Iterator[None]:
    """Rank 0's train.log (which the Trainer opens) gets the run's lines from the block's start and is closed
    when the block ends; an error that ends it is written to it first."""
    try:
        with early_lines_kept():
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
