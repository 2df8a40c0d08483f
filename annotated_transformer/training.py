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
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from .checkpoint import CheckpointWriter, average_checkpoints, load_checkpoint, model_payload, save_checkpoint
from .config import Config, config_to_dict
from .data.batch import Batch
from .distributed import (
    DistInfo,
    all_reduce_sum,
    amp_context,
    barrier,
    cleanup,
    init_distributed,
    print0,
    resolve_amp_dtype,
    world_size,
)
from .errors import ConfigError
from .loss import LabelSmoothing, SimpleLossCompute
from .model import make_model_from_config
from .monitor import GPUMonitor, format_gpu, peak_memory_gb
from .optim import build_optimizer, build_scheduler
from .run_dir import RunDir
from .tasks import build_task


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


# --------------------------------------------------------------------------- the driver


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


class _StopSignal:
    """Turns SIGTERM / SIGINT into a flag the training loop polls after every optimizer step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.signum = signum

    def requested(self, device: torch.device) -> bool:
        """True when any rank received a signal (agreed over ranks, so all stop at the same step)."""
        flag = torch.tensor(0.0 if self.signum is None else 1.0, device=device)
        return bool(all_reduce_sum(flag) > 0) if world_size() > 1 else self.signum is not None


def _check_resume_compatible(saved: dict[str, Any], cfg: Config, path: Path) -> None:
    """A resumed run must have the same model and data settings as the run that wrote last.pt."""
    now = config_to_dict(cfg)
    for section in ("model", "data"):
        if saved.get(section) != now[section]:
            diffs = [k for k in now[section] if saved.get(section, {}).get(k) != now[section][k]]
            raise ConfigError(f"cannot resume {path}: its {section} settings differ ({', '.join(diffs)}); "
                              "resume with the same config, or start a new run")


def train_worker(cfg: Config) -> dict[str, Any]:
    """Train one rank (of one or many, under torchrun) from a validated config; return the final figures.

    Builds data, model, loss, optimizer and schedule; trains epoch by epoch with `run_epoch`;
    evaluates validation loss every epoch and validation BLEU every `train.bleu_every` epochs;
    keeps `best.pt`, `last.pt` and `epoch_NN.pt`; finally scores the test split with the best
    weights and shows a few translations (or, for the copy task, counts exact copies).
    """
    info, device = init_distributed(cfg.train.device)
    try:
        return _train(cfg, info, device)
    finally:
        cleanup()


def _train(cfg: Config, info: DistInfo, device: torch.device) -> dict[str, Any]:
    t_start = time.perf_counter()
    tcfg = cfg.train
    log = print0
    run = RunDir(cfg.run_dir())
    run.check(cfg)  # on every rank, so every rank fails alike; rank 0 alone writes
    barrier()
    if info.is_main:
        run.prepare(cfg)
    barrier()

    torch.manual_seed(tcfg.seed)
    random.seed(tcfg.seed)
    task = build_task(cfg, info, log=log)
    if info.is_main and task.text is not None:
        task.text.save(run.vocab)
    model = make_model_from_config(cfg.model, task.src_vocab_size, task.tgt_vocab_size).to(device)
    criterion = LabelSmoothing(task.tgt_vocab_size, task.pad, tcfg.label_smoothing)
    optimizer = build_optimizer(model, betas=tuple(tcfg.adam_betas), eps=tcfg.adam_eps)
    scheduler = build_scheduler(optimizer, cfg.model.d_model, tcfg.lr_factor, tcfg.warmup)
    amp_dtype = resolve_amp_dtype(tcfg.precision, device)
    loader = task.train_loader(pin_memory=device.type == "cuda")
    val_batches = task.val_batches()
    state = TrainState()
    loader_state = None

    if tcfg.resume:
        ckpt = load_checkpoint(run.last, map_location=device)
        _check_resume_compatible(ckpt["config"], cfg, run.last)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        state.load_state_dict(ckpt["train_state"])
        loader_state = ckpt.get("loader")
        rng = ckpt.get("rng", {}).get(str(info.rank))
        if rng is not None:
            _set_rng_state(rng)
        if info.is_main:
            run.truncate_metrics(state.step)
        log(f"resumed {run.last}: epoch {state.epoch}, step {state.step}")

    log(f"{cfg.name}: {model.num_parameters() / 1e6:.2f}M parameters | device {device}"
        f"{f' x {info.world_size} ranks' if info.distributed else ''} | "
        f"precision {'bf16 autocast' if amp_dtype else 'fp32'} | {len(loader)} batches/epoch/rank | "
        f"run dir {run.path}")

    train_model: nn.Module = model
    if info.distributed:
        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if tcfg.compile:
        # Every bucketed batch has its own (B, S, T): one compile for symbolic shapes, not one per shape.
        train_model = torch.compile(train_model, dynamic=True)
    loss_compute = SimpleLossCompute(model.generator, criterion)
    monitor = GPUMonitor(device)
    stopper = _StopSignal()
    stopper.install()
    writer = CheckpointWriter()  # rank 0 writes checkpoints in the background while training goes on
    text_state = task.text.state_dict() if task.text is not None else None
    cfg_dict = config_to_dict(cfg)

    def save_last(loader_pos: dict[str, Any] | None) -> None:
        # Every rank's RNG state is gathered so each rank resumes its own dropout stream.
        rngs: list[Any] = [_rng_state()]
        if info.distributed:
            rngs = [None] * info.world_size
            dist.all_gather_object(rngs, _rng_state())
        if info.is_main:
            payload = model_payload(model, cfg_dict, text_state, state.state_dict())
            payload.update(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                           loader=loader_pos, rng={str(r): s for r, s in enumerate(rngs)})
            writer.save(payload, run.last)

    def better(value: float) -> bool:
        if state.best_metric is None:
            return True
        return value > state.best_metric if tcfg.best_metric == "bleu" else value < state.best_metric

    steps_per_epoch = max(len(loader) // tcfg.accum_steps, 1)
    results: dict[str, Any] = {}
    stopped = False
    gpu_samples: list[dict[str, float]] = []

    def on_log(fig: dict[str, float]) -> None:
        sample = monitor.sample()
        if sample:
            gpu_samples.append(sample)
        if info.is_main:
            run.log_metrics({"kind": "train", "epoch": state.epoch + 1, **fig})

    try:
        while not _done(state, tcfg):
            epoch = state.epoch
            loader.set_epoch(epoch)
            if loader_state is not None:
                loader.load_state_dict(loader_state)
                loader_state = None
            t_epoch = time.perf_counter()
            bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}", leave=False, dynamic_ncols=True,
                       disable=True if not (info.is_main and tcfg.progress) else None)  # None: off without a TTY
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            gpu_samples.clear()
            train_loss, state = run_epoch(
                loader, train_model, loss_compute, optimizer, scheduler, mode="train",
                accum_iter=tcfg.accum_steps, train_state=state, device=device, amp_dtype=amp_dtype,
                clip_grad_norm=tcfg.clip_grad_norm, max_steps=tcfg.max_steps, log_every=tcfg.log_every,
                log=(log if bar.disable else bar.write) if info.is_main else None, on_log=on_log,
                should_stop=lambda: stopper.requested(device), progress=None if bar.disable else bar,
            )
            bar.close()
            if stopper.requested(device):
                save_last(loader.state_dict())
                stopped = True
                name = signal.Signals(stopper.signum).name if stopper.signum else "a signal on another rank"
                log(f"stopped by {name} in epoch {epoch + 1} at step {state.step}; saved {run.last}; "
                    f"continue with train.resume=true")
                break
            # max_steps may end training inside an epoch: that epoch then stays unfinished.
            cut_short = bool(tcfg.max_steps) and state.step >= tcfg.max_steps
            if not cut_short:
                state.epoch = epoch + 1
            epoch_seconds = time.perf_counter() - t_epoch
            val_loss, _ = run_epoch(val_batches, model, loss_compute, mode="eval", device=device,
                                    amp_dtype=amp_dtype, log=None)
            record: dict[str, Any] = {"kind": "epoch", "epoch": epoch + 1, "step": state.step,
                                      "train_loss": train_loss, "val_loss": val_loss, "seconds": epoch_seconds}
            is_last = _done(state, tcfg)
            if task.name == "multi30k" and tcfg.bleu_every and ((epoch + 1) % tcfg.bleu_every == 0 or is_last):
                scored = task.score(model, device, "val", beam_size=1, amp_dtype=amp_dtype)
                record.update(bleu=scored["bleu"], bleu_signature=scored["bleu_signature"])
            if gpu_samples:
                record["gpu_util"] = sum(s["gpu_util"] for s in gpu_samples) / len(gpu_samples)
                record["gpu_mem_used_gb"] = max(s["gpu_mem_used_gb"] for s in gpu_samples)
            peak = peak_memory_gb(device)
            if peak is not None:
                record["peak_mem_gb"] = peak
            metric = record.get("bleu") if tcfg.best_metric == "bleu" else val_loss
            targets = []  # the same weights go to best.pt (when they improved) and epoch_NN.pt
            if metric is not None and better(metric):
                state.best_metric, state.best_epoch = float(metric), epoch + 1
                targets.append(run.best)
            if not cut_short:
                targets.append(run.epoch(epoch + 1))
            if info.is_main:
                if targets:
                    writer.save(model_payload(model, cfg_dict, text_state, state.state_dict()), *targets)
                if tcfg.keep_last_epochs and not cut_short:
                    run.prune_epochs(keep_after=epoch + 1 - tcfg.keep_last_epochs)
                run.log_metrics(record)
            save_last(loader.state_dict() if cut_short else None)
            bleu_txt = f" | val BLEU {record['bleu']:.2f}" if "bleu" in record else ""
            log(f"epoch {epoch + 1}/{tcfg.epochs} | step {state.step} | train loss {train_loss:.4f} | "
                f"val loss {val_loss:.4f}{bleu_txt} | {epoch_seconds:.1f} s"
                f"{format_gpu(gpu_samples[-1] if gpu_samples else {})}")
    finally:
        stopper.restore()
        writer.wait()  # every checkpoint on disk before best.pt is read back or the process exits

    if info.is_main:
        _write_charts(run, log)
    if stopped:
        results["stopped_by"] = stopper.signum or signal.SIGTERM
        return results

    # Final figures with the best weights (or their average with the last epochs', if that scores higher on val).
    best = None
    if run.best.is_file() or not info.is_main:
        barrier()
        best = load_checkpoint(run.best, map_location=device) if run.best.is_file() else None
        if best is not None:
            model.load_state_dict(best["model"])
    averaged = _average_last_epochs(run, tcfg.average_last, info, log)
    results.update(best_epoch=state.best_epoch, best_metric=state.best_metric, steps=state.step,
                   seconds=time.perf_counter() - t_start)
    if task.name == "copy":
        k = task.score(model, device)["exact_copies"]
        log(f"exact copies: {k}/100")
        results["exact_copies"] = k
    elif tcfg.final_eval:
        val = task.score(model, device, "val", amp_dtype=amp_dtype)
        chosen = f"best.pt (epoch {state.best_epoch})"
        if averaged is not None:
            model.load_state_dict(load_checkpoint(averaged, map_location=device)["model"])
            val_avg = task.score(model, device, "val", amp_dtype=amp_dtype)
            log(f"val BLEU: best.pt {val['bleu']:.2f} | {averaged.name} (last {tcfg.average_last} epochs averaged) "
                f"{val_avg['bleu']:.2f}")
            if val_avg["bleu"] > val["bleu"]:
                val, chosen = val_avg, averaged.name
            elif best is not None:
                model.load_state_dict(best["model"])
        test = task.score(model, device, "test", amp_dtype=amp_dtype)
        results.update(val_bleu=val["bleu"], test_bleu=test["bleu"], bleu_signature=test["bleu_signature"],
                       final_checkpoint=chosen)
        log(f"{chosen}: val BLEU {val['bleu']:.2f} | test BLEU {test['bleu']:.2f} (greedy; "
            f"{test['bleu_signature']})")
        record: dict[str, Any] = {"kind": "final", "step": state.step, "checkpoint": chosen, "val_bleu": val["bleu"],
                                  "test_bleu": test["bleu"], "bleu_signature": test["bleu_signature"]}
        k = cfg.decode.beam_size
        if k > 1:
            beam = task.score(model, device, "test", beam_size=k, amp_dtype=amp_dtype)
            results[f"test_bleu_beam{k}"] = record[f"test_bleu_beam{k}"] = beam["bleu"]
            log(f"{chosen}: test BLEU {beam['bleu']:.2f} (beam {k}, alpha {cfg.decode.alpha})")
        if info.is_main:
            from .evaluation import check_outputs

            log(check_outputs(task.data.splits["test"].src_text, task.data.splits["test"].tgt_text,
                              test["hypotheses"], n=3))
            run.log_metrics(record)
    log(f"done in {results['seconds']:.1f} s; run directory {run.path}")
    return results


def _average_last_epochs(run: RunDir, n: int, info: DistInfo, log: Callable[[str], None]) -> Path | None:
    """Average the newest `n` epoch_NN.pt into avg.pt (rank 0 writes, all ranks wait); None if n < 2 or too few."""
    if n < 2:
        return None
    paths = [path for _, path in run.epoch_files()[-n:]]
    if len(paths) < n:
        log(f"train.average_last={n} but only {len(paths)} epoch checkpoints exist; not averaging")
        return None
    if info.is_main:
        save_checkpoint(average_checkpoints(paths), run.avg)
        log(f"averaged {', '.join(p.name for p in paths)} into {run.avg}")
    barrier()
    return run.avg


def _done(state: TrainState, tcfg: Any) -> bool:
    """Training is over when the epochs are done or the step budget is spent."""
    return bool((tcfg.epochs and state.epoch >= tcfg.epochs) or (tcfg.max_steps and state.step >= tcfg.max_steps))


def _write_charts(run: RunDir, log: Callable[[str], None]) -> None:
    """Loss / learning-rate / BLEU curves from metrics.jsonl, as HTML and PNG (best effort)."""
    try:
        from .visualization import save_chart, training_curves_chart

        chart = training_curves_chart(run.metrics)
        save_chart(chart, run.charts / "training_curves")
    except Exception as exc:  # charts are a convenience: never lose a finished run over them
        log(f"warning: could not write charts ({type(exc).__name__}: {exc})")
