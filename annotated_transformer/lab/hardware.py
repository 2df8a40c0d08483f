"""What the benchmarks measure against: the machine's matmul peak, peak memory, and a fresh process to
measure in.

MFU (model FLOPs utilisation) = `model_flops.train_step_flops` of the real sentence lengths per second, divided by
`matmul_peak` measured in the same run and precision. The machine's name is `device.device_name`,
in the core, because a training's log names it too.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..runtime.device import synchronize
from ..harness.malloc import preloaded_for_children


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


# --------------------------------------------------------------------------- what a step trains on


def batch_lengths(batch: Any, pad: int) -> tuple[list[int], list[int]]:
    """Real source lengths and decoder-input lengths of a Batch."""
    src = (batch.src != pad).sum(-1).tolist()
    tgt = (batch.tgt_y != pad).sum(-1).tolist()
    return src, tgt


def process_peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process: CUDA allocator peak on a GPU, else the resident-set high-water mark."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib * (1 if sys.platform != "darwin" else 1 / 1024) / 2**20


def _put_result(queue: Any, fn: Any, *args: Any) -> None:
    try:
        queue.put(fn(*args))
    except BaseException as exc:  # report, never hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def in_fresh_process(what: str, fn: Any, *args: Any, preload: Path | None = None) -> dict[str, Any]:
    """`fn(*args)` (a module-level function returning a dict) in a fresh spawned process, so peak memory
    is its own, with the malloc library `preload` preloaded there; a failure is one RuntimeError naming `what`."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_put_result, args=(queue, fn, *args))
    with preloaded_for_children(preload):
        proc.start()
    result = queue.get()
    proc.join()
    if "error" in result:
        raise RuntimeError(f"{what} failed: {result['error']}")
    return result
