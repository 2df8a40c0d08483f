"""The precision the core's loop and decoding compute in: bf16 autocast, or full precision.

Apart from device.py (which device, NVML, oneDNN and malloc settings), so the loop imports only this.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch


def amp_context(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager[None]:
    """bf16 autocast on `device`, or a no-op for full precision."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
