"""GPU utilisation and memory through NVML (nvidia-ml-py), and peak-memory figures.

Everything here degrades to "nothing to report" when there is no NVIDIA GPU or no driver.
"""

from __future__ import annotations

import torch


class GPUMonitor:
    """Samples utilisation and memory of one CUDA device through NVML; silent when NVML is absent."""

    def __init__(self, device: torch.device) -> None:
        self.handle = None
        self._nvml = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # no driver, no library, a container without NVML: report nothing
            self.handle = None

    def sample(self) -> dict[str, float]:
        """{'gpu_util': %, 'gpu_mem_used_gb': GB, 'gpu_mem_total_gb': GB}, or {} without NVML."""
        if self.handle is None:
            return {}
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self.handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self.handle)
        except Exception:
            return {}
        return {"gpu_util": float(util.gpu), "gpu_mem_used_gb": mem.used / 2**30,
                "gpu_mem_total_gb": mem.total / 2**30}


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak memory allocated by PyTorch on a CUDA device since the last reset (None elsewhere)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def format_gpu(sample: dict[str, float]) -> str:
    """A short text for the epoch summary ('' when there is nothing to say)."""
    if not sample:
        return ""
    return (f" | gpu {sample['gpu_util']:.0f}% util, "
            f"{sample['gpu_mem_used_gb']:.1f}/{sample['gpu_mem_total_gb']:.0f} GB")
