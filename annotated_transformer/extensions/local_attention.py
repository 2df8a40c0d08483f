"""Local attention: self-attention that sees only the positions within a window (local_attention.window).

Each source position attends to the source positions within +/- `window` of it, and each target
position to the target positions from `window` before it up to itself; encoder-decoder attention
stays full. Only the masks change, so `LocalAttentionModel` is the paper's `EncoderDecoder` with
the band added to the masks its `encode` and `decode` receive, on the same weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kv_cache import DecoderCache
from ..model import EncoderDecoder


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


class LocalAttentionModel(EncoderDecoder):
    """An EncoderDecoder whose self-attention sees +/- `window` positions; the same parameters as `model`."""

    def __init__(self, model: EncoderDecoder, window: int) -> None:
        super().__init__(model.encoder, model.decoder, model.src_embed, model.tgt_embed, model.generator)
        self.window = window

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) -> memory (B, S, d), each position attending within the window."""
        S = src.size(1)
        band = local_mask(S, S, self.window, device=src.device)  # (1, S, S)
        # a padding row keeps its own position: no row without a key to attend to
        banded = (src_mask & band) | torch.eye(S, dtype=torch.bool, device=src.device)  # (B, S, S)
        return super().encode(src, banded)

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor | None,
               cache: DecoderCache | None = None) -> Tensor:
        """`EncoderDecoder.decode` with the causal band added to the target mask (positions counted from the cache)."""
        start = cache.length if cache is not None else 0
        L = tgt.size(1)
        band = local_mask(L, start + L, self.window, start, causal=True, device=tgt.device)  # (1, L, start+L)
        itself = local_mask(L, start + L, 0, start, device=tgt.device)  # kept even where padding masks it
        tgt_mask = band if tgt_mask is None else (tgt_mask & band) | itself  # (B, L, start+L)
        return super().decode(memory, src_mask, tgt, tgt_mask, cache)


def with_local_attention(model: EncoderDecoder, window: int) -> EncoderDecoder:
    """`model` with local attention of `window` (0: `model` itself)."""
    return LocalAttentionModel(model, window) if window else model
