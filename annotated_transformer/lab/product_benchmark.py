"""The model's matrix products one at a time, against the machine's measured matmul peak.

Each linear layer y = x W^T costs a training step three products: the forward x W^T, the input
gradient dY W and the weight gradient dY^T x. Autograd hands the last one its first operand as a
transposed view, which a BLAS or oneDNN may read more slowly than a row-major matrix; this table
times each product alone, in the config's precision, with data.batch_tokens rows, plus the weight
gradient from row-major copies (of dY^T; or of x^T, for its transpose, then copied back into W's
layout) and the copy of dY^T itself, to show what that layout costs.
It runs in the benchmark's own process, under the system's malloc unless one is preloaded
(LD_PRELOAD). `scripts/benchmark.py --products` prints it (docs/performance.md has its figures).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ..config import Config
from ..runtime.device import device_name, resolve_amp_dtype, select_device, synchronize
from .hardware import matmul_peak

FORWARD, INPUT_GRAD, WEIGHT_GRAD = "forward x W^T", "input gradient dY W", "weight gradient dY^T x"
WEIGHT_GRAD_COPIED = "weight gradient, dY^T copied first"
WEIGHT_GRAD_TRANSPOSED = "weight gradient as (x^T dY)^T, x^T and the result copied"
COPY = "the copy of dY^T alone"


def linear_shapes(cfg: Config, log: Callable[[str], None] | None = None) -> dict[str, tuple[int, int]]:
    """(in, out) features of each kind of linear layer in the config's model.

    The generator is included where the vocabulary's size is in the config (SentencePiece);
    a word-level vocabulary's size is known only once the data is read.
    """
    m = cfg.model
    shapes = {"attention projection": (m.d_model, m.d_model), "feed-forward w_1": (m.d_model, m.d_ff),
              "feed-forward w_2": (m.d_ff, m.d_model)}
    if cfg.data.tokenizer == "spm":
        shapes["generator"] = (m.d_model, cfg.data.spm_vocab_size)
    elif log:
        log(f"the generator is left out: data.tokenizer={cfg.data.tokenizer}'s vocabulary size is known only "
            "once the data is read")
    return shapes


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """The median time of `repeats` calls of `fn` after `warmup` untimed ones (kernel choice, page faults)."""
    times = []
    for i in range(warmup + repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# A linear layer's products, each a function of (x (M, k), W (n, k), dY (M, n)).
PRODUCTS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    FORWARD: lambda x, w, dy: x @ w.t(),  # (M, k) @ (k, n)
    INPUT_GRAD: lambda x, w, dy: dy @ w,  # (M, n) @ (n, k)
    WEIGHT_GRAD: lambda x, w, dy: dy.t() @ x,  # (n, M) view @ (M, k): as autograd computes it
    WEIGHT_GRAD_COPIED: lambda x, w, dy: dy.t().contiguous() @ x,  # the same from a row-major (n, M)
    # (k, M) @ (M, n), then the (n, k) result into W's row-major layout, as a gradient must be: pays where x is small
    WEIGHT_GRAD_TRANSPOSED: lambda x, w, dy: (x.t().contiguous() @ dy).t().contiguous(),
}


def time_layer(rows: int, k: int, n: int, dtype: torch.dtype, device: torch.device, repeats: int,
               warmup: int = 2) -> dict[str, float]:
    """Seconds of each of PRODUCTS for a layer k -> n over `rows` rows, and of the transposing copy alone."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)  # (M, k)
    w = torch.randn(n, k, generator=gen).to(device, dtype)  # (n, k)
    dy = torch.randn(rows, n, generator=gen).to(device, dtype)  # (M, n)
    seconds = {name: median_seconds(lambda f=f: f(x, w, dy), device, repeats, warmup)
               for name, f in PRODUCTS.items()}
    seconds[COPY] = median_seconds(lambda: dy.t().contiguous(), device, repeats, warmup)
    return seconds


def measure_products(cfg: Config, repeats: int = 10, warmup: int = 2, log: Callable[[str], None] = print
                     ) -> dict[str, Any]:
    """Every product of every kind of linear layer: ms, GFLOP/s and the share of the peak measured here."""
    device = select_device(cfg.train.device)
    dtype = resolve_amp_dtype(cfg.train.precision, device) or torch.float32
    rows, dtype_name, name = cfg.data.batch_tokens, str(dtype).removeprefix("torch."), device_name(device)
    log(f"products of {cfg.name}'s linear layers, {rows} rows, {dtype_name} on {name} ...")
    peak = matmul_peak(device, dtype)
    table = []
    for layer, (k, n) in linear_shapes(cfg, log).items():
        for product, s in time_layer(rows, k, n, dtype, device, repeats, warmup).items():
            flops = 0 if product == COPY else 2 * rows * k * n
            table.append({"layer": layer, "in": k, "out": n, "product": product, "ms": s * 1e3,
                          "gflops": flops / s / 1e9, "of_peak": flops / s / peak})
    return {"config": cfg.name, "device": name, "dtype": dtype_name,
            "rows": rows, "peak_gflops": peak / 1e9, "repeats": repeats, "warmup": warmup, "table": table}


def format_products(result: dict[str, Any]) -> str:
    """The products table as Markdown, one row per layer and product."""
    lines = [f"{result['config']}: each linear layer's products, {result['rows']} rows, {result['dtype']}, "
             f"{result['device']}; measured peak {result['peak_gflops']:,.0f} GFLOP/s "
             f"(medians of {result['repeats']} after {result['warmup']})", "",
             "| layer (in -> out) | product | ms | GFLOP/s | of the peak |", "| --- | --- | ---: | ---: | ---: |"]
    for r in result["table"]:
        rate = " | " if r["product"] == COPY else f"{r['gflops']:,.0f} | {r['of_peak']:.1%}"
        lines.append(f"| {r['layer']} ({r['in']} -> {r['out']}) | {r['product']} | {r['ms']:.2f} | {rate} |")
    return "\n".join(lines)
