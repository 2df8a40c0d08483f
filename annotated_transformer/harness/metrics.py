"""A run's metrics part: records to metrics.jsonl and TensorBoard (rank 0), the GPU samples taken at
log lines, peak memory, and the clocks reported once per process (start-up, compile warm-up)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from .monitor import GPUMonitor, format_gpu, peak_memory_gb
from .tensorboard_log import TensorBoardLog

if TYPE_CHECKING:
    from .run_dir import RunDir


class Metrics:
    """Where a Trainer's figures go; `record` is called on rank 0 only (callers check)."""

    def __init__(self, run: RunDir, device: torch.device, is_main: bool, tensorboard: bool, compile: bool,
                 t_start: float) -> None:
        self.run, self.device, self.is_main = run, device, is_main
        self.monitor = GPUMonitor(device)
        self.gpu_samples: list[dict[str, float]] = []  # NVML samples of this epoch's log lines
        self.tensorboard = TensorBoardLog(run.tensorboard) if tensorboard and is_main else None
        self.t_start = t_start  # when the Trainer began building (perf_counter), for startup_seconds
        self.startup_seconds: float | None = None  # process start to the first training step
        self.compile = compile
        self.compile_seconds: float | None = None if compile else 0.0  # set by the first step of a compiled model
        self.clocks_reported = False

    def record(self, record: dict[str, Any]) -> None:
        """One metrics record: a line of metrics.jsonl, and scalars for TensorBoard when asked."""
        self.run.log_metrics(record)
        if self.tensorboard is not None:
            self.tensorboard.add(record)

    def started(self, figures: dict[str, Any]) -> None:
        """Training starts now: the start record (the run's `figures` and the start-up time, also kept for the
        first epoch's record)."""
        self.startup_seconds, self.clocks_reported = time.perf_counter() - self.t_start, False
        if self.is_main:
            self.record({"kind": "start", **figures, "startup_seconds": self.startup_seconds})

    def new_epoch(self) -> None:
        """Forget the previous epoch's GPU samples and peak memory."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.gpu_samples.clear()

    def on_log(self, figures: dict[str, float], epoch: int) -> None:
        """A log line's figures: a GPU sample, and a 'train' record on rank 0."""
        sample = self.monitor.sample()
        if sample:
            self.gpu_samples.append(sample)
        if self.is_main:
            self.record({"kind": "train", "epoch": epoch, **figures})

    def epoch_figures(self) -> dict[str, float]:
        """GPU use and peak memory of the epoch, and the one-off clocks the first time after a start."""
        out: dict[str, float] = {}
        if not self.clocks_reported and self.startup_seconds is not None:
            self.clocks_reported = True
            out["startup_seconds"] = self.startup_seconds
            if self.compile and self.compile_seconds is not None:
                out["compile_seconds"] = self.compile_seconds
        if self.gpu_samples:
            out["gpu_util"] = sum(x["gpu_util"] for x in self.gpu_samples) / len(self.gpu_samples)
            out["gpu_mem_used_gb"] = max(x["gpu_mem_used_gb"] for x in self.gpu_samples)
        peak = peak_memory_gb(self.device)
        if peak is not None:
            out["peak_mem_gb"] = peak
        return out

    def gpu_line(self) -> str:
        """The end of an epoch's log line: the latest GPU sample ('' without NVML)."""
        return format_gpu(self.gpu_samples[-1] if self.gpu_samples else {})

    def close(self) -> None:
        """Flush and close the TensorBoard files."""
        if self.tensorboard is not None:
            self.tensorboard.close()
