"""`benchmark --gpu`: what one GPU does with the paper's base model, in one call of a few minutes.

Four parts, each written to the JSON as soon as it is measured, so that a call cut short by its time limit
still returns what it measured, then the table:

1. peak: the best FLOP/s of large matmuls in the step's precision (the denominator of every MFU here).
2. steps: the config's training step (forward, loss, backward, clipping, Adam, schedule) at the config's batch
   size and at 16k tokens, in four modes: eager; compiled (`torch.compile`); captured
   (`torch.compile(mode="reduce-overhead")`, which replays the model's forward and backward as CUDA graphs; GPUs
   only); graphed (the whole step, loss, clipping and Adam included, recorded by hand as one CUDA graph a shape:
   graphed_step.py; GPUs only). A few real batches are
   cycled, so each shape is compiled or captured once; the timed steps run without a host synchronisation
   between them, as training does. Reported: target tokens/s, ms/step, MFU, and the GPU's busy share (kernel
   time over wall time, from the profiler over a few more steps).
3. train: the user's own command (`train --config NAME`) in a child process for a fixed number of seconds, then
   stopped as Ctrl-C stops it; from its metrics: epochs done, the seconds of steps and of validation per epoch,
   the estimate for the whole run, and the last val BLEU (greedy, as training scores it).
4. decode: greedy decoding of val sentences as validation does it, on the config's untrained model: on the shapes
   it meets (`greedy_search`, eager) and on fixed shapes (`static_greedy_search`) eager, compiled and captured, each
   mode as the step modes asked for. Reported: sentences/s of a warm pass, the first pass's extra seconds
   (compiling, capturing), whether the tokens equal the dynamic search's, and how often inductor skipped CUDA
   graphs. Last, as its compiling takes longest.

The table is printed, and `gpu_check.json` written to --out.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import Config
from ..runtime.device import device_name, resolve_amp_dtype, select_device, synchronize
from ..runtime.errors import ConfigError
from ..runtime.files import write_json, writing
from ..runtime.model_flops import train_step_flops
from ..harness.run_dir import read_metrics
from ..harness.schedules import rate_on_device
from .graphed_step import GraphedStep
from .hardware import batch_lengths, datasheet_peak, matmul_peak

Log = Callable[[str], None]

MODES = ("eager", "compiled", "captured", "graphed")
GRAPH_MODES = ("captured", "graphed")  # CUDA graphs: GPUs only
LARGE_BATCH_TOKENS = 16384
DISTINCT_BATCHES = 4  # shapes cycled in the step timing: each is compiled or captured once
# Untimed passes over those batches a mode needs at least: compiling takes one, and CUDA graphs (through
# torch.compile's reduce-overhead mode) run once more to warm up and once to record before they replay.
WARM_CYCLES = {"eager": 1, "compiled": 2, "captured": 3, "graphed": 1}  # graphed warms up as it records
DECODE_SENTENCES = 512  # val sentences each decoding mode decodes: four batches at decode.batch_size 128
# The decoding rows each step mode brings: eager decodes on the shapes it meets and on fixed shapes.
DECODE_MODES = {"eager": ("dynamic", "static"), "compiled": ("static compiled",), "captured": ("static captured",),
                "graphed": ()}


def check_modes(names: list[str], device: torch.device) -> list[str]:
    """The step modes to time, in MODES' order; unknown names are a ConfigError, the graph modes need CUDA."""
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    graphs = [n for n in GRAPH_MODES if n in names]
    if graphs and device.type != "cuda":
        raise ConfigError(f"--modes {graphs[0]} needs a CUDA GPU (CUDA graphs); use --modes eager,compiled on a CPU")
    return [m for m in MODES if m in names]


def _step_parts(cfg: Config, data: Any, device: torch.device, mode: str) -> dict[str, Any]:
    """A fresh model, loss, optimizer and schedule for `mode`, wrapped as that mode runs it."""
    from .benchmark import _training_side

    compile = {"eager": False, "compiled": True, "captured": "captured", "graphed": False}[mode]  # train.compile's
    parts = _training_side("fast", replace(cfg, train=replace(cfg.train, compile=compile)), data, device)
    if mode == "graphed":  # the eager model, its whole step recorded: the rate must live on the device
        rate_on_device(parts["optimizer"])
        parts["graphed"] = GraphedStep(parts["model"], parts["loss_compute"], parts["optimizer"], parts["amp_dtype"],
                                       cfg.train.clip_grad_norm, record=device.type == "cuda")
    return parts


def _batches(cfg: Config, data: Any, batch_tokens: int, device: torch.device) -> list[Any]:
    """The first DISTINCT_BATCHES training batches of about `batch_tokens` tokens, on the device."""
    from ..data import load_translation_data

    sized = replace(cfg, data=replace(cfg.data, batch_tokens=batch_tokens))
    loader = load_translation_data(sized, log=None).train_loader(cfg.train.seed, pin_memory=device.type == "cuda")
    out = []
    for batch in loader:
        out.append(batch.to(device))
        if len(out) == DISTINCT_BATCHES:
            break
    return out


def _busy_share(run_steps: Callable[[int], None], steps: int, device: torch.device) -> float | None:
    """Kernel time over wall time across `steps` steps, from torch.profiler (None off CUDA or on failure)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            synchronize(device)
            t0 = time.perf_counter()
            run_steps(steps)
            synchronize(device)
            wall = time.perf_counter() - t0
        kernel_us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
        return min(1.0, kernel_us / 1e6 / wall)
    except Exception:  # the profiler is a diagnostic: its failure must not cost the other figures
        return None


def time_steps(cfg: Config, data: Any, device: torch.device, mode: str, batches_by_size: dict[int, list[Any]],
               steps: int, warmup: int, peak: float, log: Log) -> dict[int, dict[str, Any]]:
    """One mode's figures at each batch size: one model, compiled or captured once, serves every size."""
    from ..loop import step_norm, train_step

    p = _step_parts(cfg, data, device, mode)
    m, pad, vocab = cfg.model, data.text.pad_id, len(data.text.tgt_vocab)
    rows: dict[int, dict[str, Any]] = {}
    for size, batches in batches_by_size.items():
        lengths = [batch_lengths(b, pad) for b in batches]
        tokens = [sum(t) for _, t in lengths]
        flops = [train_step_flops(m.d_model, m.d_ff, m.N, vocab, s, t, m.N_dec or None) for s, t in lengths]
        losses: list[torch.Tensor] = []

        def run(n: int, start: int = 0) -> None:
            for i in range(start, start + n):
                batch = batches[i % len(batches)]
                if "graphed" in p:
                    loss = p["graphed"](batch, step_norm([batch], 1))
                    p["scheduler"].step()
                else:
                    loss, _ = train_step([batch], p["train_model"], p["loss_compute"], p["optimizer"],
                                         p["scheduler"], amp_dtype=p["amp_dtype"],
                                         clip_grad_norm=cfg.train.clip_grad_norm)
                losses.append(loss.detach())

        synchronize(device)
        t0 = time.perf_counter()
        run(max(warmup, WARM_CYCLES[mode]) * len(batches))
        synchronize(device)
        warmup_s = time.perf_counter() - t0
        n = steps - steps % len(batches) or len(batches)  # whole cycles: every shape counted equally
        t0 = time.perf_counter()
        run(n)
        synchronize(device)
        seconds = time.perf_counter() - t0
        busy = _busy_share(lambda k: run(k), len(batches) * 2, device)
        step_tokens = sum(tokens[i % len(batches)] for i in range(n))
        step_flops = sum(flops[i % len(batches)] for i in range(n))
        finite = all(math.isfinite(x) for x in torch.stack(losses).float().tolist())
        rows[size] = {"mode": mode, "batch_tokens": size, "tokens_per_s": step_tokens / seconds,
                      "ms_per_step": 1000 * seconds / n, "mfu": step_flops / seconds / peak, "gpu_busy": busy,
                      "warmup_s": warmup_s, "steps": n, "loss_finite": finite}
        r = rows[size]
        log(f"  {mode:9s} {size:6d} tokens | {r['tokens_per_s']:10.0f} tokens/s | {r['ms_per_step']:7.1f} ms/step"
            f" | MFU {100 * r['mfu']:5.1f}%" + (f" | GPU busy {100 * busy:.0f}%" if busy is not None else "")
            + f" | warm-up {warmup_s:.0f} s")
    return rows


def train_for(config: str, overrides: list[str], seconds: float, epochs_total: int, out: Path, log: Log
              ) -> dict[str, Any]:
    """The train command in a child process for `seconds`, stopped by SIGINT; what its metrics say."""
    cmd = [sys.executable, "-m", "annotated_transformer", "train", "--config", config, *overrides,
           f"train.out_dir={out}", "train.overwrite=true", "train.progress=false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_path = out.with_suffix(".log")
    with writing(log_path, "write the training's log"):
        stream = open(log_path, "w", encoding="utf-8")
    with stream:
        proc = subprocess.Popen(cmd, stdout=stream, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the trainer saves last.pt and stops, as on Ctrl-C
            try:
                code = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    return summarize_run(out, code, seconds, epochs_total, log_path, log)


def summarize_run(out: Path, code: int, seconds: float, total: int, log_path: Path, log: Log) -> dict[str, Any]:
    """Epochs, per-epoch step and validation seconds, the whole run's estimate and the last val BLEU."""
    metrics = out / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []  # a torn last line of the stopped run is skipped
    epochs = [r for r in records if r.get("kind") == "epoch"]
    result: dict[str, Any] = {"exit_code": code, "seconds_allowed": seconds, "epochs_done": len(epochs),
                              "epochs_total": total, "log": str(log_path)}
    if not epochs:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-5:] if log_path.is_file() else []
        log(f"  no epoch finished in {seconds:.0f} s (exit code {code}); the log ends: " + " / ".join(tail))
        return result
    step_s = [e["seconds"] for e in epochs]
    eval_s = [e.get("eval_seconds", 0.0) for e in epochs]
    walls = [e["wall_seconds"] for e in epochs]
    per_epoch = (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else walls[0]
    bleus = [e["bleu"] for e in epochs if e.get("bleu") is not None]
    result.update(step_seconds_per_epoch=statistics.median(step_s), eval_seconds_per_epoch=statistics.median(eval_s),
                  wall_seconds_per_epoch=per_epoch, first_epoch_wall_seconds=walls[0],
                  estimate_whole_run_s=walls[0] + per_epoch * (total - 1),
                  val_bleu=bleus[-1] if bleus else None)
    log(f"  {len(epochs)} of {total} epochs in {walls[-1]:.0f} s | per epoch: steps "
        f"{result['step_seconds_per_epoch']:.1f}"
        f" s, validation {result['eval_seconds_per_epoch']:.1f} s, in all {per_epoch:.1f} s | whole run about "
        f"{result['estimate_whole_run_s'] / 60:.1f} min" + (f" | val BLEU {bleus[-1]:.2f}" if bleus else ""))
    return result


def time_decoding(cfg: Config, data: Any, device: torch.device, modes: list[str], log: Log) -> dict[str, Any]:
    """Greedy decoding of DECODE_SENTENCES val sentences in each of `modes` (module docstring, part 4); each mode's
    tokens are compared with the dynamic search's, and the captured mode says how often inductor skipped CUDA graphs."""
    from torch._dynamo.utils import counters

    from ..decode.inference import translate_ids
    from ..decode.static import compiled_step, static_step
    from ..extensions.builder import build_model

    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, len(data.text.src_vocab), len(data.text.tgt_vocab)).to(device).eval()
    steps = {"dynamic": None, "static": static_step, "static compiled": compiled_step(None),
             "static captured": compiled_step("reduce-overhead")}
    text, dec, sources = data.text, cfg.decode, data.splits["val"].src[:DECODE_SENTENCES]

    def decode(mode: str) -> list[list[int]]:
        return translate_ids(model, sources, pad=text.pad_id, bos=text.bos_id, eos=text.eos_id, device=device,
                             max_len_a=dec.max_len_a, batch_size=dec.batch_size, static=steps[mode],
                             amp_dtype=resolve_amp_dtype(cfg.train.precision, device),
                             attention_kernel=cfg.model.attention_kernel)

    reference = decode("dynamic") if modes and "dynamic" not in modes else None  # what every mode must give
    rows: dict[str, Any] = {}
    for mode in modes:
        log(f"decoding, {mode} ({len(sources)} val sentences) ...")
        seconds, skips = [], counters["inductor"]["cudagraph_skips"]
        try:
            for _ in range(2):  # the first pass compiles or captures each shape; the second is the figure
                synchronize(device)
                t0 = time.perf_counter()
                out = decode(mode)
                synchronize(device)
                seconds.append(time.perf_counter() - t0)
        except Exception as exc:  # as in the step timing: one mode failing must not cost the others
            log(f"  {mode} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            rows[mode] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            continue
        reference = out if reference is None else reference  # "dynamic" comes first when asked for
        rows[mode] = {"sentences_per_s": len(sources) / seconds[1], "seconds": seconds[1],
                      "first_pass_extra_s": max(seconds[0] - seconds[1], 0.0), "same_tokens": out == reference,
                      "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips}
    return rows


def gpu_check(cfg: Config, overrides: list[str], steps: int = 30, warmup: int = 2, modes: list[str] | None = None,
              train_seconds: float = 150.0, out_dir: str | Path | None = None, log: Log = print) -> dict[str, Any]:
    """Measure the peak, the step in each mode at two batch sizes, and a timed training run (module docstring)."""
    from ..data import load_translation_data
    from .benchmark import resolve_fast_precision

    if cfg.data.dataset != "multi30k":
        raise ConfigError(f"benchmark --gpu needs a Multi30k config; {cfg.name} has data.dataset={cfg.data.dataset}")
    if steps < 1 or train_seconds < 0:
        raise ConfigError(f"--steps must be at least 1 and --train-seconds at least 0 (got {steps}, {train_seconds})")
    device = select_device(cfg.train.device)
    if device.type != "cuda" and cfg.train.device == "auto":
        raise ConfigError("benchmark --gpu found no CUDA GPU that torch can use (docs/gpu.md says why that happens); "
                          "pass --device cpu to run the same check on the CPU")
    modes = check_modes(modes or (list(MODES) if device.type == "cuda" else ["eager", "compiled"]), device)
    resolve_fast_precision(cfg, device)
    out = Path(out_dir) if out_dir else None
    result: dict[str, Any] = {"device": device_name(device), "config": cfg.name, "torch": torch.__version__,
                              "precision": cfg.train.precision, "date": time.strftime("%Y-%m-%d"), "steps": {}}

    def save() -> None:
        if out:  # rewritten after each part: a check cut short leaves the parts before it readable
            write_json(out / "gpu_check.json", result)

    dtype = torch.bfloat16 if cfg.train.precision == "bf16" else torch.float32
    result["peak_flop_per_s"] = max(matmul_peak(device, dtype) for _ in range(2))
    result["datasheet_peak_flop_per_s"] = datasheet_peak(device) if dtype == torch.bfloat16 else None
    log(f"{result['device']} | {cfg.name} | {cfg.train.precision} | measured peak "
        f"{result['peak_flop_per_s'] / 1e12:.1f} TFLOP/s")
    save()
    data = load_translation_data(cfg, log=None)  # builds the cache the training child then reads
    sizes = list(dict.fromkeys([cfg.data.batch_tokens, LARGE_BATCH_TOKENS]))
    batches = {size: _batches(cfg, data, size, device) for size in sizes}
    for mode in modes:
        log(f"step, {mode} ({steps} timed steps a batch size) ...")
        try:
            for size, row in time_steps(cfg, data, device, mode, batches, steps, warmup, result["peak_flop_per_s"],
                                        log).items():
                result["steps"].setdefault(str(size), {})[mode] = row
        except Exception as exc:  # one mode failing (a compiler error) must not cost the others
            log(f"  {mode} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            result["steps"].setdefault("errors", {})[mode] = f"{type(exc).__name__}: {exc}"[:2000]
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the mode's model and optimizer are gone: give their memory back
        save()
    del batches
    if train_seconds > 0:
        run_dir = (out or Path(os.environ.get("TMPDIR", "/tmp"))) / "gpu_check_run"
        log(f"training {cfg.name} for {train_seconds:.0f} s (the train command, in {run_dir}) ...")
        device_override = [f"train.device={cfg.train.device}"] if cfg.train.device != "auto" else []
        result["train"] = train_for(cfg.name, [*device_override, *overrides], train_seconds, cfg.train.epochs,
                                   run_dir, log)
        save()
    # last: its compiling and capturing take longest, and a call cut short has the figures above already
    result["decode"] = time_decoding(cfg, data, device, [m for mode in modes for m in DECODE_MODES[mode]], log)
    save()
    return result


def format_gpu_check(result: dict[str, Any]) -> str:
    """The check's table: one row a (batch size, mode), then the training run's line."""
    lines = [f"{result['device']} | {result['config']} | {result['precision']} | peak "
             f"{result['peak_flop_per_s'] / 1e12:.1f} TFLOP/s measured"
             + (f", {result['datasheet_peak_flop_per_s'] / 1e12:.0f} datasheet"
                if result.get("datasheet_peak_flop_per_s") else ""),
             "", "| batch tokens | mode | tokens/s | ms/step | MFU | GPU busy | vs eager |",
             "|---|---|---|---|---|---|---|"]
    for size, by_mode in result["steps"].items():
        if size == "errors":
            continue
        eager = by_mode.get("eager", {}).get("tokens_per_s")
        for mode, r in by_mode.items():
            busy = f"{100 * r['gpu_busy']:.0f}%" if r.get("gpu_busy") is not None else "-"
            ratio = f"{r['tokens_per_s'] / eager:.2f}x" if eager else "-"
            lines.append(f"| {size} | {mode} | {r['tokens_per_s']:.0f} | {r['ms_per_step']:.1f} | "
                         f"{100 * r['mfu']:.1f}% | {busy} | {ratio} |")
    for mode, error in result["steps"].get("errors", {}).items():
        lines.append(f"{mode}: failed: {error.splitlines()[0]}")
    if result.get("decode"):
        lines += ["", "| greedy val decoding | sentences/s | first pass extra s | tokens as dynamic | graph skips |",
                  "|---|---|---|---|---|"]
        lines += [f"| {mode} | failed: {r['error'].splitlines()[0]} | | | |" if "error" in r else
                  f"| {mode} | {r['sentences_per_s']:.0f} | {r['first_pass_extra_s']:.1f} | "
                  f"{'yes' if r['same_tokens'] else 'NO'} | {r['cudagraph_skips']} |"
                  for mode, r in result["decode"].items()]
    t = result.get("train")
    if t and t.get("epochs_done"):
        bleu = f", val BLEU {t['val_bleu']:.2f}" if t.get("val_bleu") is not None else ""
        lines += ["", f"training: {t['epochs_done']} of {t['epochs_total']} epochs in {t['seconds_allowed']:.0f} s; "
                  f"per epoch {t['step_seconds_per_epoch']:.1f} s of steps and {t['eval_seconds_per_epoch']:.1f} s of "
                  f"validation; the whole run about {t['estimate_whole_run_s'] / 60:.1f} min{bleu}"]
    elif t:
        lines += ["", f"training: no epoch finished in {t['seconds_allowed']:.0f} s (exit code {t['exit_code']}; "
                  f"log {t['log']})"]
    return "\n".join(lines)

