"""`benchmark --all`: the whole speed picture of one machine and one trained checkpoint, side by side.

Per round, each in its own fresh process: training eager, training compiled (`train.compile=true`),
then every decoding engine of `engine_benchmark` (ours in fp32, bf16 and int8; CTranslate2 float32
and int8) on the checkpoint's weights. Rounds are interleaved, so a machine that drifts (a shared
VM does) drifts for every side alike, and each figure is the median over the rounds. The header
names the CPU (or GPU), its bf16 and AMX support and the threads.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import torch

from ..config import Config
from ..runtime.device import cpu_info, device_name, select_device
from ..harness.malloc import training_malloc
from .engine_benchmark import format_engines, median_rows

TRAIN_SIDES = ("eager", "compiled")


def cpu_flags() -> dict[str, bool]:
    """The CPU features that decide its precision: AVX512-BF16, AMX tiles, AVX2 (from /proc/cpuinfo)."""
    flags = set((cpu_info("flags") or "").split())
    return {"avx512_bf16": "avx512_bf16" in flags, "amx": "amx_tile" in flags, "avx2": "avx2" in flags}


def machine_line(device: torch.device) -> str:
    """'AMD EPYC, 2 threads | AVX512-BF16 yes, AMX no' (the GPU and CUDA on a GPU)."""
    if device.type != "cpu":
        return device_name(device)
    f = cpu_flags()
    yes = {True: "yes", False: "no"}
    return f"{device_name(device)} | AVX512-BF16 {yes[f['avx512_bf16']]}, AMX {yes[f['amx']]}, AVX2 {yes[f['avx2']]}"


def measure_speed_report(cfg: Config, checkpoint: str, rounds: int = 3, steps: int = 20, warmup: int = 5,
                         limit: int | None = 500, log: Any = print) -> dict[str, Any]:
    """Training eager vs compiled and the decoding engines, `rounds` interleaved rounds; medians (see module doc)."""
    from .benchmark import measure_in_subprocess, resolve_fast_precision
    from .engine_benchmark import compare_engines  # looked up when called: tests stand in for it
    from ..data import load_translation_data

    device = select_device(cfg.train.device)
    resolve_fast_precision(cfg, device)
    cfg.train.device = str(device)
    load_translation_data(cfg, log=None)  # the cache once, before the timed children start
    train: dict[str, list[dict[str, Any]]] = {side: [] for side in TRAIN_SIDES}
    engine_rounds: list[list[dict[str, Any]]] = []
    engines: dict[str, Any] = {}
    preload = training_malloc(cfg.train.malloc, cfg.train.device)  # training as it runs; decoding as translate does
    for r in range(rounds):
        for side in TRAIN_SIDES:
            log(f"round {r + 1}/{rounds}: training {side}, {warmup} warm-up + {steps} timed steps ...")
            side_cfg = replace(cfg, train=replace(cfg.train, compile=side == "compiled"))
            train[side].append(measure_in_subprocess("fast", side_cfg, steps, warmup, preload))
        log(f"round {r + 1}/{rounds}: decoding engines ...")
        engines = compare_engines(checkpoint, limit=limit, data_root=cfg.data.root or None, log=log)
        engine_rounds.append(engines["rows"])
    med = {side: {key: statistics.median(x[key] for x in runs) for key in
                  ("tokens_per_s", "step_ms", "mfu", "peak_flop_per_s", "warmup_s", "peak_mem_gb")}
           for side, runs in train.items()}
    for side, runs in train.items():
        med[side]["tokens_per_s_all"] = [x["tokens_per_s"] for x in runs]
        med[side]["precision"], med[side]["malloc"] = runs[0]["precision"], runs[0].get("malloc", "system")
    return {"machine": machine_line(device), "torch": torch.__version__, "config": cfg.name,
            "checkpoint": checkpoint, "rounds": rounds, "steps": steps, "warmup": warmup, "train": med,
            "compiled_over_eager": med["compiled"]["tokens_per_s"] / med["eager"]["tokens_per_s"],
            "engines": {**engines, "rows": median_rows(engine_rounds, engines["beam"])}}


def format_speed_report(result: dict[str, Any]) -> str:
    """The report as a header and two Markdown tables."""
    t = result["train"]
    lines = [f"machine: {result['machine']} | torch {result['torch']} | config {result['config']} | "
             f"training under malloc {t['eager']['malloc']} | medians of {result['rounds']} interleaved rounds", "",
             "| training | tokens/s | ms/step | MFU | precision | warm-up s (compilation) | peak mem GB |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for side in TRAIN_SIDES:
        s = t[side]
        lines.append(f"| {side} | {s['tokens_per_s']:,.0f} | {s['step_ms']:.1f} | {100 * s['mfu']:.1f}% of "
                     f"{s['peak_flop_per_s'] / 1e9:,.0f} GFLOP/s | {s['precision']} | {s['warmup_s']:.1f} | "
                     f"{s['peak_mem_gb']:.2f} |")
    lines += [f"compiled / eager: {result['compiled_over_eager']:.2f}x", "",
              f"decoding {result['engines']['sentences']} test2016 sentences, checkpoint {result['checkpoint']}:", "",
              format_engines(result["engines"])]
    return "\n".join(lines)
