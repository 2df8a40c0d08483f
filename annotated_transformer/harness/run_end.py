"""The end of a run: its charts, the final scores of the chosen weights, example translations, and the
command that translates with them."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..config import Config
from ..decode.static import Step
from ..loop import Log, TrainState
from .checkpointer import Checkpointer
from .distributed import DistInfo
from .metrics import Metrics
from .resume import RunCounters
from .run_dir import RunDir


class EndingRun(Protocol):
    """What the end of a run reads of its Trainer (harness/trainer.py, which calls `finish`)."""

    cfg: Config
    train_state: TrainState
    counters: RunCounters
    info: DistInfo
    run: RunDir
    checkpoints: Checkpointer
    metrics: Metrics
    model: nn.Module
    task: Any  # harness/tasks.py: CopyTask or TranslationTask
    device: torch.device
    amp_dtype: torch.dtype | None
    val_step: Step | None  # the step the run validates with on static shapes (trainer.py)
    t_start: float  # time.perf_counter() when the run began
    log: Log


def finish(tr: EndingRun) -> dict[str, Any]:
    """Charts; the best (or averaged) weights scored; the run's figures as a dict and a last log line."""
    t, s, c = tr.cfg.train, tr.train_state, tr.counters
    if tr.info.is_main:
        write_charts(tr.run, tr.log)
    found_best = tr.checkpoints.load_model_file(tr.model, tr.run.best)  # the file read (perhaps an older best.pt)
    averaged = tr.checkpoints.average_last(t.average_last, tr.log, steps=bool(t.save_every_steps))
    results: dict[str, Any] = {"best_epoch": c.best_epoch, "best_step": c.best_step, "best_metric": c.best_metric,
                               "steps": s.step, "train_seconds": c.train_seconds, "wall_seconds": c.wall_seconds,
                               "train_flops": c.flops}
    if t.target_bleu:
        results.update(target_bleu=t.target_bleu, target_epoch=c.target_epoch, target_seconds=c.target_seconds,
                       target_flops=c.target_flops)
    scored_at = f"step {c.best_step}, epoch {c.best_epoch}" if t.val_every_steps else f"epoch {c.best_epoch}"
    chosen = f"{found_best.name} ({scored_at})" if found_best else "the final weights"
    chosen_file = found_best or tr.run.last
    if tr.task.name == "copy":
        k = tr.task.score(tr.model, tr.device)["exact_copies"]
        tr.log(f"exact copies: {k}/100")
        results["exact_copies"] = k
        if tr.info.is_main:  # the run's end, as a translation's final scores mark it (a sweep reads it)
            tr.metrics.record({"kind": "final", "step": s.step, "checkpoint": chosen, "exact_copies": k,
                               "train_seconds": c.train_seconds, "train_flops": c.flops})
    elif t.final_eval:
        chosen_file = final_scores(tr, results, chosen, chosen_file, averaged)
    elif tr.info.is_main:  # the run's end without scores (train.final_eval=false): what tells a finished run
        tr.metrics.record({"kind": "final", "step": s.step, "checkpoint": chosen, "checkpoint_file": chosen_file.name,
                           "train_seconds": c.train_seconds, "train_flops": c.flops})
    results["seconds"] = time.perf_counter() - tr.t_start
    target = ""
    if t.target_bleu:
        target = (f"; val BLEU {t.target_bleu:g} reached at epoch {c.target_epoch} after "
                  f"{c.target_seconds / 60:.1f} min of training" if c.target_epoch is not None else
                  f"; val BLEU {t.target_bleu:g} not reached")
    tr.log(f"done in {results['seconds']:.1f} s ({c.train_seconds / 60:.1f} min of training steps){target}; "
           f"run directory {tr.run.path}")
    if tr.task.name != "copy":  # the last line: how to use the model the run chose
        tr.log(f"translate with it: {translate_command(chosen_file)}")
    return results


def translate_command(checkpoint: Path) -> str:
    """The command that translates with `checkpoint`, spelt the way this training was started (a checkout's
    scripts/ under uv or not, `python -m annotated_transformer`, or the console command)."""
    launched = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if launched.name == "train.py" and launched.with_name("translate.py").is_file():
        program = f"python {relative(launched.with_name('translate.py'))}"
    elif launched.name == "annotated-transformer":
        program = "annotated-transformer translate"
    else:
        program = "python -m annotated_transformer translate"
    return f"{uv_run()}{program} --checkpoint {relative(checkpoint)}"


def uv_run() -> str:
    """'uv run ' when `uv run` started this process from a project's environment and the current folder is in the
    project, 'uv run --project ROOT ' from elsewhere; '' without uv, or without a project (uvx, --no-project)."""
    environment = Path(sys.prefix)
    root = environment.parent
    if not os.environ.get("UV") or environment.name != ".venv" or not (root / "pyproject.toml").is_file():
        return ""
    try:
        Path.cwd().resolve().relative_to(root.resolve())
    except ValueError:
        return f"uv run --project {root} "
    return "uv run "


def relative(path: Path) -> str:
    """`path` as typed from the current folder: relative inside it, absolute elsewhere."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def final_scores(tr: EndingRun, results: dict[str, Any], chosen: str, chosen_file: Path,
                 averaged: Path | None) -> Path:
    """Val BLEU of the chosen weights (best, or avg if it scores higher), then greedy and beam
    BLEU on test (or, with train.score_test=false, beam on val: settings are chosen on val alone).
    Returns the file of the chosen weights."""
    t, beam_size = tr.cfg.train, tr.cfg.decode.beam_size
    score = functools.partial(tr.task.score, static=tr.val_step)  # greedy on validation's shapes (beam: its own)
    score_test = t.score_test and "test" in tr.task.data.splits  # your own files may have no test split
    val = score(tr.model, tr.device, "val", amp_dtype=tr.amp_dtype)
    if averaged is not None:
        kept = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
        tr.checkpoints.load_model_file(tr.model, averaged)
        val_avg = score(tr.model, tr.device, "val", amp_dtype=tr.amp_dtype)
        files = "step checkpoints" if t.save_every_steps else "epochs"
        tr.log(f"val BLEU: {chosen_file.name} {val['bleu']:.2f} | {averaged.name} (last {t.average_last} "
               f"{files} averaged) {val_avg['bleu']:.2f}")
        if val_avg["bleu"] > val["bleu"]:
            val, chosen, chosen_file = val_avg, averaged.name, averaged
        else:
            tr.model.load_state_dict(kept)
    c = tr.counters
    record: dict[str, Any] = {"kind": "final", "step": tr.train_state.step, "checkpoint": chosen,
                              "checkpoint_file": chosen_file.name, "val_bleu": val["bleu"],
                              "bleu_signature": val["bleu_signature"], "train_seconds": c.train_seconds,
                              "train_flops": c.flops, "target_epoch": c.target_epoch,
                              "target_seconds": c.target_seconds, "target_flops": c.target_flops}
    shown = val
    if score_test:
        shown = test = score(tr.model, tr.device, "test", amp_dtype=tr.amp_dtype)
        record["test_bleu"] = test["bleu"]
    tr.log(f"{chosen}: val BLEU {val['bleu']:.2f}"
           + (f" | test BLEU {record['test_bleu']:.2f}" if score_test else " (test not scored)")
           + f" (greedy; {val['bleu_signature']})")
    if beam_size > 1:
        split = "test" if score_test else "val"
        beam = score(tr.model, tr.device, split, beam_size=beam_size, amp_dtype=tr.amp_dtype)
        record[f"{split}_bleu_beam{beam_size}"] = beam["bleu"]
        tr.log(f"{chosen}: {split} BLEU {beam['bleu']:.2f} (beam {beam_size}, alpha {tr.cfg.decode.alpha})")
    results.update({key: v for key, v in record.items() if key.endswith("bleu") or "_beam" in key},
                   bleu_signature=val["bleu_signature"], final_checkpoint=chosen)
    if tr.info.is_main:
        from ..scoring import check_outputs

        split = tr.task.data.splits["test" if score_test else "val"]
        tr.log(check_outputs(split.src_text, split.tgt_text, shown["hypotheses"], n=3))
        tr.metrics.record(record)
    return chosen_file


def write_charts(run: RunDir, log: Log) -> None:
    """Loss / learning-rate / BLEU curves from metrics.jsonl, as HTML and PNG (best effort)."""
    try:
        from ..visualization import save_chart, training_curves_chart

        chart = training_curves_chart(run.metrics)
        save_chart(chart, run.charts / "training_curves")
    except Exception as exc:  # charts are a convenience: never lose a finished run over them
        log(f"warning: could not write charts ({type(exc).__name__}: {exc})")
