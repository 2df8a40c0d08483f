"""Where one training step's time goes: torch.profiler over real bucketed batches, each operator's own time
put in one of a few kinds (`scripts/benchmark.py --profile`).

    matmul       the matrix products: every linear layer (forward and backward), the output projection
    attention    scaled_dot_product_attention with what it runs inside (in training with dropout the CPU runs
                 its math form: batched products, softmax, dropout), and the backward of its products and softmax
    elementwise  everything else the model does per element: dropout masks, layer norms, residual adds,
                 ReLU, embeddings, autocast's casts, their backward
    loss         the label-smoothed loss on the logits (fused_loss.py), forward and backward
    optimizer    Adam (fused), zeroing the gradients, the schedule
    overhead     the step's wall time that no operator accounts for: Python, dispatch, autograd's engine

The step is the fast path's (`loop.train_step`), written out here with a profiler range around
each phase, so an operator is counted as loss or optimizer by the phase it runs in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..config import Config, config_from_dict, config_to_dict
from ..runtime.device import select_device
from ..runtime.precision import amp_context
from ..extensions.builder import build_training
from ..harness.malloc import malloc_in_use, training_malloc
from ..harness.schedules import build_scheduler
from ..loop import Log
from .hardware import in_fresh_process

KINDS = ("matmul", "attention", "elementwise", "loss", "optimizer", "overhead")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_linear", "aten::matmul",
              "mkldnn::_linear_pointwise", "aten::mkldnn_linear")
PHASES = ("forward", "loss", "backward", "optimizer")


ATTENTION_MARKS = ("scaled_dot_product", "flash_attention", "BmmBackward", "SoftmaxBackward")
ATTENTION_OPS = ("aten::bmm", "aten::_softmax", "aten::_softmax_backward_data")  # only attention uses them here


def _kind(name: str, ancestors: list[str]) -> str:
    """The kind of an operator's own time, from its name and the names of the ranges and ops around it."""
    phase = next((a for a in ancestors if a in PHASES), None)
    if name in ATTENTION_OPS or any(m in a for a in [name, *ancestors] for m in ATTENTION_MARKS):
        return "attention"
    if name in MATMUL_OPS:
        return "matmul"
    if phase == "optimizer":
        return "optimizer"
    if phase == "loss" or any("SmoothedCrossEntropy" in a for a in [name, *ancestors]):
        return "loss"
    return "elementwise"


def _ancestors(event: Any) -> list[str]:
    """The names of the events around `event`, innermost first."""
    names = []
    while (event := event.cpu_parent) is not None:
        names.append(event.name)
    return names


def _step(p: dict[str, Any], batch: Any) -> None:
    """One optimizer step of the fast path, a profiler range around each phase."""
    model, loss_compute, optimizer, scheduler = p["model"], p["loss_compute"], p["optimizer"], p["scheduler"]
    norm = float(max(batch.ntokens, 1))
    with amp_context(batch.src.device, p["amp_dtype"]):
        with record_function("forward"):
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
        with record_function("loss"):
            summed, loss = loss_compute(out, batch.tgt_y, norm)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    summed.item()  # the step is over when its loss is known


def _batches(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def profile_training_step(cfg: Config, steps: int = 10, warmup: int = 3, log: Log | None = print) -> dict[str, Any]:
    """Profile `steps` training steps of `cfg`'s model on its bucketed Multi30k batches (after `warmup`)."""
    from ..data import load_translation_data

    device = select_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    data = load_translation_data(cfg, log=None)
    text = data.text
    model, loss_compute, _, optimizer, amp_dtype, _, _ = build_training(cfg, len(text.src_vocab), len(text.tgt_vocab),
                                                                        text.pad_id, device)  # eager, as profiled
    scheduler = build_scheduler(optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup)
    p = {"model": model.train(), "loss_compute": loss_compute, "optimizer": optimizer, "scheduler": scheduler,
         "amp_dtype": amp_dtype}
    batches = _batches(data.train_loader(cfg.train.seed))
    for _ in range(warmup):
        _step(p, next(batches).to(device))
    chosen = [next(batches).to(device) for _ in range(steps)]
    if log:
        log(f"profiling {steps} training steps of {cfg.name} after {warmup} warm-up steps ...")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for batch in chosen:
            _step(p, batch)
        wall = time.perf_counter() - t0
    return summarize(prof.events(), wall, steps, sum(b.ntokens for b in chosen), cfg.name, amp_dtype)


def profile_in_fresh_process(cfg: Config, steps: int = 10, warmup: int = 3, log: Log | None = print
                             ) -> dict[str, Any]:
    """`profile_training_step` in a fresh process under the config's train.malloc, as training runs its steps."""
    if log:
        log(f"profiling {steps} training steps of {cfg.name} after {warmup} warm-up steps ...")
    preload = training_malloc(cfg.train.malloc, cfg.train.device)
    return in_fresh_process("the training profile", _profile_config_dict, config_to_dict(cfg), steps, warmup,
                            preload=preload)


def _profile_config_dict(cfg_dict: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    return profile_training_step(config_from_dict(cfg_dict), steps, warmup, log=None)


def summarize(events: Any, wall: float, steps: int, tokens: int, name: str, amp_dtype: torch.dtype | None
              ) -> dict[str, Any]:
    """Milliseconds per step and share of the wall time for each of KINDS, from the profiler's events."""
    ms = dict.fromkeys(KINDS, 0.0)
    for event in events:
        if event.name in PHASES or event.device_type != torch.autograd.DeviceType.CPU:
            continue
        ms[_kind(event.name, _ancestors(event))] += event.self_cpu_time_total / 1000 / steps  # us -> ms per step
    step_ms = 1000 * wall / steps
    ms["overhead"] = max(step_ms - sum(v for k, v in ms.items() if k != "overhead"), 0.0)
    top = sorted(((e.key, e.self_cpu_time_total / 1000 / steps) for e in events.key_averages()
                  if e.key not in PHASES), key=lambda kv: -kv[1])[:8]
    return {"config": name, "steps": steps, "step_ms": step_ms, "tokens_per_s": tokens / wall,
            "precision": "bf16" if amp_dtype else "fp32", "threads": torch.get_num_threads(),
            "malloc": malloc_in_use(), "ms": ms, "share": {k: v / step_ms for k, v in ms.items()}, "top_ops": top}


def format_profile(result: dict[str, Any]) -> str:
    """The profile as a Markdown table: kind, ms per step, share; then the costliest operators."""
    lines = [f"{result['config']}: {result['step_ms']:.0f} ms/step, {result['tokens_per_s']:.0f} target tokens/s, "
             f"{result['precision']}, {result['threads']} threads, malloc {result['malloc']} "
             f"({result['steps']} steps)", "",
             "| kind | ms/step | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {result['ms'][k]:.1f} | {100 * result['share'][k]:.1f}% |" for k in KINDS]
    lines += ["", "costliest operators (own time, ms/step): " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                                       result["top_ops"])]
    return "\n".join(lines)

