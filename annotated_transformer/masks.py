"""The masks (True = may attend), shared by the model (decoding) and the data (Batch), neither importing the other."""

from __future__ import annotations

import torch
from torch import Tensor


def subsequent_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """(1, size, size) boolean mask: position i may attend to positions 0..i only."""
    return torch.ones(1, size, size, dtype=torch.bool, device=device).tril()


def padding_mask(ids: Tensor, pad: int) -> Tensor:
    """(B, 1, S) boolean mask from (B, S) ids: every query may attend to the non-padding positions."""
    return (ids != pad).unsqueeze(-2)

