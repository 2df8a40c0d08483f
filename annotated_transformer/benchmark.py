"""The work behind scripts/benchmark.py: our fast path against the notebook-style pipeline, one run.

Training (same model size, same machine, back to back, each side in its own fresh process so
peak memory is its own):

* notebook: the notebook's pipeline. Raw sentence pairs in batches of 32, spaCy tokenisation and
  padding to 72 inside the DataLoader's collate for every batch, fp32, explicit softmax attention
  (`model.attention=naive`), PyTorch's own nn.Dropout and default Adam implementation, and the loss
  on log-probabilities (log-softmax, then label smoothing).
* fast: this project's path. Tokenised once and cached, length-bucketed batches of about
  `data.batch_tokens` tokens, fused scaled_dot_product_attention, bf16 autocast where the hardware
  has native bf16 (CUDA GPUs with bf16, CPUs with AVX512-BF16 or AMX), fused Adam, the cheaper
  CPU dropout mask of `fast_dropout.Dropout`, the loss fused with the log-softmax
  (`LabelSmoothing.from_logits`), optional torch.compile.

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
import json
import math
import multiprocessing as mp
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .config import Config
from .config_loading import config_from_dict, config_to_dict
from .device import native_bf16, select_device, synchronize
from .errors import ConfigError
from .loop import Log
from .masks import padding_mask


# --------------------------------------------------------------------------- hardware


def device_name(device: torch.device) -> str:
    """A human-readable name of the machine the benchmark ran on."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    model = platform.processor() or "CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 20) -> float:
    """The best FLOP/s of `repeats` timed n x n x n matmuls (after two untimed ones): the measured peak.

    The best, not the median: a peak taken at a slow moment (another process on a 2-core CPU)
    once made the step look faster than the hardware, an MFU of 117%.
    """
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = math.inf
    for i in range(repeats + 2):
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        if i >= 2:  # the first calls pay for kernel selection and page faults
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


# Dense bf16 tensor-core peaks from NVIDIA's datasheets (FLOP/s), shown beside the measured peak.
DATASHEET_BF16 = {"H100 80GB HBM3": 989.4e12, "H100 SXM": 989.4e12, "H100 PCIe": 756.5e12, "H100 NVL": 835.5e12,
                  "H200": 989.4e12, "A100": 312e12}


def datasheet_peak(device: torch.device) -> float | None:
    """The datasheet's dense bf16 peak of this GPU, when it is one we know (None elsewhere)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in DATASHEET_BF16.items() if key in name), None)


# --------------------------------------------------------------------------- FLOPs


def train_step_flops(d_model: int, d_ff: int, N: int, tgt_vocab: int,
                     src_lens: list[int], tgt_lens: list[int], N_dec: int | None = None) -> float:
    """Matmul FLOPs of one training step on these sentences: 3x the forward pass (backward = 2x).

    Per sentence with S source and T target positions (no padding), per layer: encoder self-attention
    4 S d^2 projections + 2 S^2 d scores and mixing, feed-forward 2 S d d_ff; decoder self-attention
    4 T d^2 + 2 T^2 d, source attention 2 T d^2 + 2 S d^2 + 2 T S d, feed-forward 2 T d d_ff; then the
    generator T d V. Each multiply-add counts 2. The decoder has `N_dec` layers (default N).
    """
    d = d_model
    total = 0
    for S, T in zip(src_lens, tgt_lens):
        enc = 4 * S * d * d + 2 * S * S * d + 2 * S * d * d_ff
        dec = 4 * T * d * d + 2 * T * T * d + 2 * T * d * d + 2 * S * d * d + 2 * T * S * d + 2 * T * d * d_ff
        total += N * enc + (N_dec or N) * dec + T * d * tgt_vocab
    return 3 * 2 * float(total)


def batch_lengths(batch: Any, pad: int) -> tuple[list[int], list[int]]:
    """Real source lengths and decoder-input lengths of a Batch."""
    src = (batch.src != pad).sum(-1).tolist()
    tgt = (batch.tgt_y != pad).sum(-1).tolist()
    return src, tgt


# --------------------------------------------------------------------------- training, one side


def notebook_dropout(model: torch.nn.Module) -> None:
    """Give every dropout layer back PyTorch's own implementation (the notebook's nn.Dropout)."""
    from .fast_dropout import Dropout

    for m in model.modules():
        if isinstance(m, Dropout):
            m.__class__ = torch.nn.Dropout


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, else the resident-set high-water mark."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib * (1 if sys.platform != "darwin" else 1 / 1024) / 2**20


def measure_training(side: str, cfg_dict: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """Time `warmup + steps` optimizer steps of one side ('notebook' or 'fast'); return its figures."""
    from .data import load_translation_data
    from .data.notebook_pipeline import notebook_dataloader
    from .loss import LabelSmoothing, SimpleLossCompute
    from .model import make_model_from_config
    from .optim import build_optimizer, build_scheduler
    from .loop import run_epoch

    cfg = config_from_dict(cfg_dict)
    device = select_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    data = load_translation_data(cfg, log=None)
    text = data.text
    notebook = side == "notebook"
    if notebook:
        model_cfg = replace(cfg.model, attention="naive")
        amp_dtype = None
        loader = notebook_dataloader(data.splits["train"].pairs(), text, seed=cfg.train.seed)
    else:
        model_cfg = cfg.model
        amp_dtype = torch.bfloat16 if cfg.train.precision == "bf16" else None
        loader = data.train_loader(cfg.train.seed, pin_memory=device.type == "cuda")
    model = make_model_from_config(model_cfg, len(text.src_vocab), len(text.tgt_vocab)).to(device)
    if notebook:
        notebook_dropout(model)
    criterion = LabelSmoothing(len(text.tgt_vocab), text.pad_id, cfg.train.label_smoothing)
    optimizer = build_optimizer(model, tuple(cfg.train.adam_betas), cfg.train.adam_eps,
                                fused=False if notebook else None)
    scheduler = build_scheduler(optimizer, model_cfg.d_model, cfg.train.lr_factor, cfg.train.warmup)
    train_model = torch.compile(model, dynamic=True) if (cfg.train.compile and not notebook) else model
    # The notebook side keeps its order: log-softmax, then the divergence on log-probabilities.
    loss_compute = SimpleLossCompute(model.generator, criterion, fused=not notebook)
    peak = matmul_peak(device, amp_dtype or torch.float32)  # measured again after the steps: the best counts
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    rates, step_times, flops_rates, losses = [], [], [], []
    it = iter(loader)
    for i in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # a short epoch: start the next one
            it = iter(loader)
            batch = next(it)
        loss, _ = run_epoch([batch], train_model, loss_compute, optimizer, scheduler, device=device,
                            amp_dtype=amp_dtype, log=None)  # ends with a host sync (the loss)
        synchronize(device)
        dt = time.perf_counter() - t0
        if i < warmup:
            continue
        src_lens, tgt_lens = batch_lengths(batch, text.pad_id)
        flops = train_step_flops(model_cfg.d_model, model_cfg.d_ff, model_cfg.N, len(text.tgt_vocab),
                                 src_lens, tgt_lens, model_cfg.N_dec or None)
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
        "attention": model_cfg.attention, "peak_mem_gb": peak_memory_gb(device),
        "loss_finite": all(math.isfinite(x) for x in losses), "steps": steps, "warmup": warmup,
    }


def _put_result(queue: Any, fn: Any, *args: Any) -> None:
    try:
        queue.put(fn(*args))
    except BaseException as exc:  # report, never hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def in_fresh_process(what: str, fn: Any, *args: Any) -> dict[str, Any]:
    """`fn(*args)` (a module-level function returning a dict) in a fresh spawned process, so peak memory
    is its own; a failure there is one RuntimeError naming `what`."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_put_result, args=(queue, fn, *args))
    proc.start()
    result = queue.get()
    proc.join()
    if "error" in result:
        raise RuntimeError(f"{what} failed: {result['error']}")
    return result


def measure_in_subprocess(side: str, cfg: Config, steps: int, warmup: int) -> dict[str, Any]:
    """`measure_training` in a fresh process (spawn): peak memory is that side's alone."""
    return in_fresh_process(f"{side} training benchmark", measure_training, side, config_to_dict(cfg), steps, warmup)


# --------------------------------------------------------------------------- decoding


def measure_decoding(cfg: Config, checkpoint: str | None, device: torch.device, one_sentence_limit: int,
                     beam: int = 5, limit: int | None = None) -> dict[str, Any]:
    """Sentences/s on test2016: the notebook's one-sentence decoder, batched cached greedy, beam `beam`.

    `limit` keeps the first sentences only (for quick checks); the one-sentence decoder gets
    `one_sentence_limit` of them, evenly spread, because it is slow.
    """
    from .data import load_translation_data
    from .decoding import greedy_decode_naive, strip_special
    from .model import make_model_from_config
    from .translator import Translator, decode_amp_dtype, translate_ids

    if checkpoint:
        tr = Translator.from_checkpoint(checkpoint, device=device)
        model, text, dcfg, model_cfg = tr.model, tr.text, tr.config.decode, tr.config.model
        sources = [tr.text.text_to_ids(s, "src") for s in _test_sources(cfg, tr)]
    else:
        data = load_translation_data(cfg, log=None)
        text, dcfg, model_cfg = data.text, cfg.decode, cfg.model
        torch.manual_seed(cfg.train.seed)
        model = make_model_from_config(model_cfg, len(text.src_vocab), len(text.tgt_vocab)).to(device).eval()
        sources = [ids.tolist() for ids in data.splits["test"].src]
    sources = sources[:limit] if limit else sources
    amp_dtype = decode_amp_dtype(device)  # what Translator, evaluate.py and translate.py use
    common = dict(pad=text.pad_id, bos=text.bos_id, eos=text.eos_id, device=device, max_len_a=dcfg.max_len_a,
                  batch_size=dcfg.batch_size, amp_dtype=amp_dtype)

    def timed(fn):
        synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(device)
        return out, time.perf_counter() - t0

    translate_ids(model, sources[:8], **common)  # warm-up (kernel selection, allocator)
    greedy, t_greedy = timed(lambda: translate_ids(model, sources, **common))
    _, t_beam = timed(lambda: translate_ids(model, sources, beam_size=beam, alpha=dcfg.alpha, **common))

    # The notebook's decoder: explicit attention, fp32, one sentence, the whole prefix every step.
    ref_model = make_model_from_config(replace(model_cfg, attention="naive"), len(text.src_vocab),
                                       len(text.tgt_vocab)).to(device).eval()
    ref_model.load_state_dict(model.state_dict())
    stride = max(1, len(sources) // max(one_sentence_limit, 1))
    subset = list(range(0, len(sources), stride))[:one_sentence_limit]
    cap = model.max_positions

    def one_by_one() -> list[list[int]]:
        outs = []
        with torch.no_grad():
            for i in subset:
                src = torch.tensor([sources[i]], device=device)
                max_len = min(len(sources[i]) + dcfg.max_len_a, cap)
                out = greedy_decode_naive(ref_model, src, padding_mask(src, text.pad_id), max_len,
                                          text.bos_id, text.eos_id, text.pad_id)
                outs.append(strip_special(out[0].tolist(), text.bos_id, text.eos_id, text.pad_id))
        return outs

    single, t_single = timed(one_by_one)
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


def _test_sources(cfg: Config, tr: Any) -> list[str]:
    from .data import read_split, resolve_multi30k_dir

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
                  one_sentence_limit: int = 100, decode_limit: int | None = None, train: bool = True, decode: bool = True,
                  sweep_tokens: list[int] | None = None, sweep_lengths: list[int] | None = None,
                  out_dir: str | None = None, log: Log = print) -> dict[str, Any]:
    """Everything scripts/benchmark.py reports, as one dict (see the module docstring)."""
    if steps < 1 or warmup < 0:
        raise ConfigError(f"--steps must be at least 1 and --warmup at least 0 (got {steps}, {warmup})")
    if cfg.data.dataset != "multi30k":
        raise ConfigError(f"the benchmark needs a Multi30k config, {cfg.name} has data.dataset={cfg.data.dataset}")
    device = select_device(cfg.train.device)
    resolve_fast_precision(cfg, device)
    cfg.train.device = str(device)
    from .data import load_translation_data

    load_translation_data(cfg, log=None)  # build the cache once, before the timed children start
    result: dict[str, Any] = {
        "device": device_name(device), "config": cfg.name, "torch": torch.__version__,
        "model": {"N": cfg.model.N, "N_dec": cfg.model.N_dec or cfg.model.N, "d_model": cfg.model.d_model,
                  "d_ff": cfg.model.d_ff, "h": cfg.model.h},
        "batch_tokens": cfg.data.batch_tokens, "compile": cfg.train.compile,
    }
    if train:
        sides = {}
        for side in ("notebook", "fast"):
            log(f"training, {side} side: {warmup} warm-up + {steps} timed steps ...")
            sides[side] = measure_in_subprocess(side, cfg, steps, warmup)
            s = sides[side]
            log(f"  {s['tokens_per_s']:9.0f} tokens/s | {s['step_ms']:8.1f} ms/step | "
                f"{s['tokens_per_step']:6.0f} tokens/step | {s['precision']} | MFU {100 * s['mfu']:.1f}% "
                f"of {s['peak_flop_per_s'] / 1e9:.0f} GFLOP/s | peak mem {s['peak_mem_gb']:.2f} GB")
        ref, fast = sides["notebook"], sides["fast"]
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
            from .visualization import save_chart

            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            save_chart(shape_chart(rows, f"{cfg.name} on {result['device']}"), out / "sweep")
            result["sweep_chart"] = str(out / "sweep.png")
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def format_summary(result: dict[str, Any]) -> str:
    """The headline lines of a benchmark result."""
    lines = [f"device: {result['device']} | config {result['config']} | torch {result['torch']}"]
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
