"""The masks (True = may attend), shared by the model (decoding) and the data (Batch) without either importing the other."""

from __future__ import annotations

import torch
from torch import Tensor


def subsequent_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """(1, size, size) boolean mask: position i may attend to positions 0..i only."""
    return torch.ones(1, size, size, dtype=torch.bool, device=device).tril()


def padding_mask(ids: Tensor, pad: int) -> Tensor:
    """(B, 1, S) boolean mask from (B, S) ids: every query may attend to the non-padding positions."""
    return (ids != pad).unsqueeze(-2)


def local_mask(queries: int, keys: int, window: int, start: int = 0, causal: bool = False,
               device: torch.device | str | None = None) -> Tensor:
    """(1, queries, keys) boolean band: the query at position start+i may attend to keys within +/- window.

    `causal` keeps only the keys at or before the query (the decoder's self-attention, where the
    subsequent mask already removes the future). The query's own position is always inside the band,
    so a row that padding empties elsewhere still keeps itself (no all-masked row, no NaN).
    """
    q = torch.arange(start, start + queries, device=device).unsqueeze(1)  # (queries, 1)
    k = torch.arange(keys, device=device).unsqueeze(0)  # (1, keys)
    band = (k - q).abs() <= window
    if causal:
        band &= k <= q
    return band.unsqueeze(0)  # (1, queries, keys)
