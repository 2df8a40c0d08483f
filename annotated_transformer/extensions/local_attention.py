"""Local attention: self-attention that sees only the positions within a window (local_attention.window).

Each source position attends to the source positions within +/- `window` of it, and each target
position to the target positions from `window` before it up to itself; encoder-decoder attention
stays full. Only the masks change, so `LocalAttentionModel` is the paper's `EncoderDecoder` with
the band added to the masks its `encode` and `decode` receive, on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import EncoderDecoder
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, param


@dataclass
class LocalAttentionConfig:
    """Local attention (extensions/local_attention.py); off by default."""

    window: int = param(0, "self-attention (encoder, and the decoder's causal one) sees only +/- this many "
                        "positions; encoder-decoder attention stays full (0: off, full attention)")


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

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor) -> Tensor:
        """`EncoderDecoder.decode` with the causal band added to the target mask."""
        T = tgt.size(1)
        itself = local_mask(T, T, 0, device=tgt.device)  # kept even where padding masks it
        return super().decode(memory, src_mask, tgt, (tgt_mask & self.step_mask(0, T, tgt.device)) | itself)

    def step_mask(self, start: int, length: int, device: torch.device) -> Tensor:
        """(1, length, start+length): what target positions start.. see within the band; incremental decoding's mask
        (`decode.incremental.decode_step`)."""
        return local_mask(length, start + length, self.window, start, causal=True, device=device)


def with_local_attention(model: EncoderDecoder, window: int) -> EncoderDecoder:
    """`model` with local attention of `window` (0: `model` itself)."""
    return LocalAttentionModel(model, window) if window else model


def validate(cfg: CoreConfig) -> None:
    """The local_attention section's rule."""
    window = cfg.local_attention.window
    if window < 0:
        raise ConfigError(f"local_attention.window must be 0 (full attention) or positive, got {window}")


EXTENSION = Extension(
    name="local_attention", section=LocalAttentionConfig, help="local attention", order=10, kind="model",
    on=lambda section: section.window != 0,
    install=lambda cfg, model: with_local_attention(model, cfg.local_attention.window),
    validate=validate, arms={"local attention w=2": ("local_attention.window=2",)},
)
