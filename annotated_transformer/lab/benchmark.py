"""The work behind scripts/benchmark.py: our fast path against the notebook-style pipeline, one run.

Training (same model size, same machine, back to back, each side in its own fresh process so
peak memory is its own). Both sides build their model, loss and optimizer as training does
(`build_training`) and differ in the data pipeline, the precision and the speed plan's switch, `train.fast`:

* notebook: the notebook's pipeline. Raw sentence pairs in batches of 32, spaCy tokenisation and
  padding to 72 inside the DataLoader's collate for every batch, fp32, and `train.fast=false`: explicit
  softmax attention, PyTorch's own nn.Dropout and default Adam implementation, and the loss on
  log-probabilities (log-softmax, then label smoothing).
* fast: this project's path. Tokenised once and cached, length-bucketed batches of about
  `data.batch_tokens` tokens, bf16 autocast where the hardware has native bf16 (CUDA GPUs with bf16,
  CPUs with AVX512-BF16 or AMX), and `train.fast=true`: what the speed plan (`fast.speed_up_training`)
  installs: attention as `model.attention_kernel` says (auto: PyTorch's fused kernel on GPUs, the
  explicit product on CPUs, where it is faster), fused Adam, the cheaper CPU dropout mask, the loss fused
  with the log-softmax, and torch.compile as `train.compile` says.

Both sides run the real `run_epoch`, one optimizer step per call, timed from asking the loader for
a batch to the end of the optimizer step (the device synchronised). Throughput counts target
(non-padding) tokens; the figure is the median over the timed steps after warm-up.

MFU: model FLOPs of a step (matmuls only, 3x the forward pass, on the real sentence lengths, padding
excluded) per second, divided by the matmul peak measured in the same run (a 2048^3 matmul on CPU,
8192^3 on CUDA, in the step's precision).

Decoding test2016: the notebook's decoder (one sentence at a time, the whole prefix re-run every
step, fp32, explicit attention) against batched cached greedy and beam 5, on the same weights.
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..config import Config, config_from_dict, config_to_dict
from ..runtime.device import device_name, native_bf16, select_device, synchronize
from ..runtime.errors import ConfigError
from ..runtime.files import write_json, writing
from ..harness.malloc import malloc_in_use, training_malloc
from ..loop import Log
from ..masks import padding_mask
from ..runtime.model_flops import train_step_flops
from .hardware import (
    batch_lengths,
    datasheet_peak,
    in_fresh_process,
    matmul_peak,
    process_peak_memory_gb,
)


# --------------------------------------------------------------------------- training, one side


def _training_side(side: str, cfg: Config, data: Any, device: torch.device) -> dict[str, Any]:
    """One side's loader and `build_training`'s parts, with its schedule: the notebook's ('notebook': fp32 and
    train.fast=false) or ours ('fast': the config's precision and the speed plan)."""
    from ..data.notebook_pipeline import notebook_dataloader
    from ..extensions.builder import build_training
    from ..harness.schedules import build_scheduler

    text = data.text
    if side == "notebook":
        run_cfg = replace(cfg, model=replace(cfg.model, attention_kernel="explicit"),
                          train=replace(cfg.train, fast=False, compile=False, precision="fp32"))
        loader = notebook_dataloader(data.splits["train"].pairs(), text, seed=cfg.train.seed)
    else:
        run_cfg = cfg
        loader = data.train_loader(cfg.train.seed, pin_memory=device.type == "cuda")
    parts = build_training(run_cfg, len(text.src_vocab), len(text.tgt_vocab), text.pad_id, device)
    t = run_cfg.train
    scheduler = build_scheduler(parts.optimizer, cfg.model.d_model, t.lr_factor, t.warmup,
                                lr_on_device=t.compile == "captured")  # as training has it
    return dict(parts._asdict(), side_cfg=run_cfg, loader=loader, train_model=parts.step_model, scheduler=scheduler)


def measure_training(side: str, cfg_dict: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """Time `warmup + steps` optimizer steps of one side ('notebook' or 'fast'); return its figures."""
    from ..data import load_translation_data
    from ..loop import train_step

    cfg = config_from_dict(cfg_dict)
    device = select_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    data = load_translation_data(cfg, log=None)
    text = data.text
    p = _training_side(side, cfg, data, device)
    side_cfg, amp_dtype, loader = p["side_cfg"], p["amp_dtype"], p["loader"]
    peak = matmul_peak(device, amp_dtype or torch.float32)  # measured again after the steps: the best counts
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    rates, step_times, flops_rates, losses = [], [], [], []
    warmup_s = 0.0  # the untimed steps: with train.compile, the compilation
    it = iter(loader)
    for i in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # a short epoch: start the next one
            it = iter(loader)
            batch = next(it)
        p["train_model"].train()
        loss_sum, _ = train_step([batch.to(device, non_blocking=True)], p["train_model"], p["loss_compute"],
                                 p["optimizer"], p["scheduler"], amp_dtype=amp_dtype, objective=p["objective"], step=i)
        loss = loss_sum.item() / max(batch.ntokens, 1)  # a host sync, as a training loop's log line makes
        synchronize(device)
        dt = time.perf_counter() - t0
        if i < warmup:
            warmup_s += dt
            continue
        src_lens, tgt_lens = batch_lengths(batch, text.pad_id)
        m = side_cfg.model
        flops = train_step_flops(m.d_model, m.d_ff, m.N, len(text.tgt_vocab), src_lens, tgt_lens, m.N_dec or None)
        rates.append(sum(tgt_lens) / dt)
        step_times.append(dt)
        flops_rates.append(flops / dt)
        losses.append(loss)
    peak = max(peak, matmul_peak(device, amp_dtype or torch.float32))
    return {
        "side": side, "tokens_per_s": statistics.median(rates), "step_ms": 1000 * statistics.median(step_times),
        "tokens_per_step": statistics.median([r * t for r, t in zip(rates, step_times)]),
        "flop_per_s": statistics.median(flops_rates), "peak_flop_per_s": peak,
        "mfu": statistics.median(flops_rates) / peak, "precision": "bf16" if amp_dtype else "fp32",
        "datasheet_peak_flop_per_s": datasheet_peak(device) if amp_dtype else None,
        "attention": side_cfg.model.attention_kernel, "peak_mem_gb": process_peak_memory_gb(device),
        "loss_finite": all(math.isfinite(x) for x in losses), "steps": steps, "warmup": warmup, "warmup_s": warmup_s,
        "malloc": malloc_in_use(),
    }


def measure_in_subprocess(side: str, cfg: Config, steps: int, warmup: int, preload: Path | None = None
                          ) -> dict[str, Any]:
    """`measure_training` in a fresh process (spawn): peak memory is that side's alone; `preload` its malloc
    library (`harness.malloc.training_malloc`), as training runs."""
    return in_fresh_process(f"{side} training benchmark", measure_training, side, config_to_dict(cfg), steps, warmup,
                            preload=preload)


# --------------------------------------------------------------------------- decoding


def measure_decoding(cfg: Config, checkpoint: str | None, device: torch.device, one_sentence_limit: int,
                     beam: int = 5, limit: int | None = None) -> dict[str, Any]:
    """Sentences/s on test2016: the notebook's one-sentence decoder, batched cached greedy, beam `beam`.

    `limit` keeps the first sentences only (for quick checks); the one-sentence decoder gets
    `one_sentence_limit` of them, evenly spread, because it is slow.
    """
    from ..data import load_translation_data
    from ..decode.inference import translate_ids
    from ..extensions.builder import build_model
    from ..deploy.translator import Translator, decode_amp_dtype

    if checkpoint:
        tr = Translator.from_checkpoint(checkpoint, device=device)
        model, text, dcfg, run_cfg = tr.model, tr.text, tr.config.decode, tr.config
        sources = [tr.text.text_to_ids(s, "src") for s in _test_sources(cfg, tr)]
    else:
        data = load_translation_data(cfg, log=None)
        text, dcfg, run_cfg = data.text, cfg.decode, cfg
        torch.manual_seed(cfg.train.seed)
        model = build_model(run_cfg, len(text.src_vocab), len(text.tgt_vocab)).to(device).eval()
        sources = [ids.tolist() for ids in data.splits["test"].src]
    sources = sources[:limit] if limit else sources
    amp_dtype = decode_amp_dtype(device)  # what Translator, evaluate.py and translate.py use
    common = dict(pad=text.pad_id, bos=text.bos_id, eos=text.eos_id, device=device, max_len_a=dcfg.max_len_a,
                  batch_size=dcfg.batch_size, amp_dtype=amp_dtype, attention_kernel=run_cfg.model.attention_kernel)

    translate_ids(model, sources[:8], **common)  # warm-up (kernel selection, allocator)
    greedy, t_greedy = _timed(device, lambda: translate_ids(model, sources, **common))
    _, t_beam = _timed(device, lambda: translate_ids(model, sources, beam_size=beam, alpha=dcfg.alpha, **common))
    stride = max(1, len(sources) // max(one_sentence_limit, 1))
    subset = list(range(0, len(sources), stride))[:one_sentence_limit]
    single, t_single = _timed(device, lambda: _one_by_one(model, text, [sources[i] for i in subset], dcfg.max_len_a,
                                                          device))
    agree = sum(single[j] == greedy[i] for j, i in enumerate(subset)) / len(subset)
    return {
        "sentences": len(sources), "one_sentence_sentences": len(subset),
        "one_sentence_per_s": len(subset) / t_single, "batched_greedy_per_s": len(sources) / t_greedy,
        f"beam{beam}_per_s": len(sources) / t_beam, "ratio": (len(sources) / t_greedy) / (len(subset) / t_single),
        "greedy_seconds": t_greedy, f"beam{beam}_seconds": t_beam, "one_sentence_seconds": t_single,
        "one_sentence_agreement": agree, "batch_size": dcfg.batch_size,
        "precision": "bf16" if amp_dtype else "fp32", "trained": bool(checkpoint),
        "mean_output_tokens": sum(map(len, greedy)) / len(greedy),
    }


def _timed(device: torch.device, fn: Any) -> tuple[Any, float]:
    """fn() and its seconds, the device synchronised on both sides."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


@torch.no_grad()
def _one_by_one(model: Any, text: Any, sources: list[list[int]], max_len_a: int,
                device: torch.device) -> list[list[int]]:
    """The notebook's decoder on `model` as built (no speed plan: explicit attention), fp32, one sentence at a
    time, the whole prefix every step."""
    from ..decode.inference import longest_target, strip_special
    from ..decoding import greedy_decode

    outs = []
    for ids in sources:
        src = torch.tensor([ids], device=device)
        max_len = min(len(ids) + max_len_a, longest_target(model))
        out = greedy_decode(model, src, padding_mask(src, text.pad_id), max_len,
                            text.bos_id, text.eos_id, text.pad_id)
        outs.append(strip_special(out[0].tolist(), text.bos_id, text.eos_id, text.pad_id))
    return outs


def _test_sources(cfg: Config, tr: Any) -> list[str]:
    from ..data import read_split, resolve_multi30k_dir

    d = copy.deepcopy(tr.config.data)
    d.root, d.cache_dir = cfg.data.root or d.root, cfg.data.cache_dir
    src, _ = read_split(resolve_multi30k_dir(d), "test", d.src_lang, d.tgt_lang)
    return src


# --------------------------------------------------------------------------- the whole run


def resolve_fast_precision(cfg: Config, device: torch.device) -> None:
    """train.precision=auto means bf16 wherever the hardware runs it natively (the benchmark's fast path)."""
    if cfg.train.precision == "auto":
        cfg.train.precision = "bf16" if native_bf16(device) else "fp32"
    elif cfg.train.precision == "bf16" and not native_bf16(device):
        print(f"warning: {device} has no native bf16; bf16 autocast will be slow here", file=sys.stderr)


def run_benchmark(cfg: Config, steps: int = 10, warmup: int = 2, checkpoint: str | None = None,
                  one_sentence_limit: int = 100, decode_limit: int | None = None, train: bool = True,
                  decode: bool = True,
                  sweep_tokens: list[int] | None = None, sweep_lengths: list[int] | None = None,
                  out_dir: str | None = None, log: Log = print) -> dict[str, Any]:
    """Everything scripts/benchmark.py reports, as one dict (see the module docstring)."""
    if steps < 1 or warmup < 0:
        raise ConfigError(f"--steps must be at least 1 and --warmup-steps at least 0 (got {steps}, {warmup})")
    if cfg.data.dataset != "multi30k":
        raise ConfigError(f"the benchmark needs a Multi30k config, {cfg.name} has data.dataset={cfg.data.dataset}")
    device = select_device(cfg.train.device)
    resolve_fast_precision(cfg, device)
    cfg.train.device = str(device)
    from ..data import load_translation_data

    load_translation_data(cfg, log=None)  # build the cache once, before the timed children start
    result: dict[str, Any] = {
        "device": device_name(device), "config": cfg.name, "torch": torch.__version__,
        "model": {"N": cfg.model.N, "N_dec": cfg.model.N_dec or cfg.model.N, "d_model": cfg.model.d_model,
                  "d_ff": cfg.model.d_ff, "h": cfg.model.h},
        "batch_tokens": cfg.data.batch_tokens, "compile": cfg.train.compile,
    }
    if train:
        sides, preload = {}, training_malloc(cfg.train.malloc, cfg.train.device)
        for side in ("notebook", "fast"):
            log(f"training, {side} side: {warmup} warm-up + {steps} timed steps ...")
            sides[side] = measure_in_subprocess(side, cfg, steps, warmup, preload)
            s = sides[side]
            log(f"  {s['tokens_per_s']:9.0f} tokens/s | {s['step_ms']:8.1f} ms/step | "
                f"{s['tokens_per_step']:6.0f} tokens/step | {s['precision']} | MFU {100 * s['mfu']:.1f}% "
                f"of {s['peak_flop_per_s'] / 1e9:.0f} GFLOP/s | peak mem {s['peak_mem_gb']:.2f} GB")
        ref, fast = sides["notebook"], sides["fast"]
        result["malloc"] = fast["malloc"] if device.type == "cpu" else None  # the training steps'
        result["train"] = {
            "notebook_tokens_per_s": ref["tokens_per_s"], "fast_tokens_per_s": fast["tokens_per_s"],
            "ratio": fast["tokens_per_s"] / ref["tokens_per_s"], "mfu": fast["mfu"], "notebook_mfu": ref["mfu"],
            "notebook_peak_mem_gb": ref["peak_mem_gb"], "fast_peak_mem_gb": fast["peak_mem_gb"],
            "notebook": ref, "fast": fast,
        }
    if decode:
        log(f"decoding test2016 ({'checkpoint ' + checkpoint if checkpoint else 'untrained weights'}) ...")
        if not checkpoint:
            log("  warning: without --checkpoint the model is untrained; outputs run to the length limit")
        result["decode"] = measure_decoding(cfg, checkpoint, device, one_sentence_limit, limit=decode_limit)
    if sweep_tokens and sweep_lengths:
        log("sweep (fast path, synthetic batches) ...")
        from .shape_benchmark import shape_chart, shape_sweep

        rows = shape_sweep(cfg, sweep_tokens, sweep_lengths, max(2, steps // 3), log=log)
        result["sweep"] = rows
        if out_dir:
            from ..visualization import save_chart

            out = Path(out_dir)
            with writing(out / "sweep.html", "write the chart"):
                out.mkdir(parents=True, exist_ok=True)
                save_chart(shape_chart(rows, f"{cfg.name} on {result['device']}"), out / "sweep")
            result["sweep_chart"] = str(out / "sweep.png")
    if out_dir:
        write_json(Path(out_dir) / "benchmark.json", result)
    return result


def format_summary(result: dict[str, Any]) -> str:
    """The headline lines of a benchmark result."""
    malloc = f" | training under malloc {result['malloc']}" if result.get("malloc") else ""
    lines = [f"device: {result['device']}{malloc} | config {result['config']} | torch {result['torch']}"]
    if "train" in result:
        t = result["train"]
        lines.append(f"train  notebook  {t['notebook_tokens_per_s']:9.0f} tok/s | fast {t['fast_tokens_per_s']:9.0f} "
                     f"tok/s | ratio {t['ratio']:.1f}x | fast MFU {100 * t['mfu']:.1f}% "
                     f"(notebook {100 * t['notebook_mfu']:.1f}%)")
    if "decode" in result:
        d = result["decode"]
        lines.append(f"decode one-sentence {d['one_sentence_per_s']:8.1f} sent/s | batched greedy "
                     f"{d['batched_greedy_per_s']:8.1f} sent/s | beam 5 {d['beam5_per_s']:8.1f} sent/s | "
                     f"ratio {d['ratio']:.1f}x")
    return "\n".join(lines)
