"""The key/value cache of incremental decoding (`incremental.py`): what each attention sublayer keeps between steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AttentionCache:
    """Keys and values of one attention sublayer kept between decoding steps.

    Self-attention (`static=False`) appends the new step's keys/values; encoder-decoder
    attention (`static=True`) projects the memory once and reuses it every step.
    """

    static: bool
    k: Tensor | None = None  # (B, h, t, d_k)
    v: Tensor | None = None  # (B, h, t, d_k)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keep this step's keys/values (appended after the earlier ones in self-attention); return all kept."""
        if not self.static and self.k is not None:
            k = torch.cat([self.k, k], dim=2)  # (B, h, t+1, d_k)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def index_select(self, index: Tensor) -> None:
        """Keep (and reorder) batch rows: for beam search and for dropping finished sentences."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


@dataclass
class DecoderCache:
    """Everything incremental decoding keeps between steps: per-layer (self, source) attention caches."""

    layers: list[tuple[AttentionCache, AttentionCache]]
    length: int = 0  # target positions already decoded (the next position's index)

    def advance(self, n: int) -> int:
        """Count `n` new positions; return the index of the first of them."""
        self.length += n
        return self.length - n

    @classmethod
    def empty(cls, layers: int) -> DecoderCache:
        """A cache for a decoder of `layers` layers, nothing decoded yet."""
        return cls([(AttentionCache(static=False), AttentionCache(static=True)) for _ in range(layers)])

    def index_select(self, index: Tensor) -> None:
        """Keep/reorder batch rows of every cached tensor (greedy search drops finished sentences with it)."""
        for self_cache, src_cache in self.layers:
            self_cache.index_select(index)
            src_cache.index_select(index)
