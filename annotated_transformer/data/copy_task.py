"""The notebook's synthetic copy task: learn to output the input sequence."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .batch import Batch

COPY_PAD = 0  # the padding id (never generated)
COPY_START = 1  # the start symbol: the first token of every sequence


def data_gen(V: int, batch_size: int, nbatches: int, seq_len: int = 10,
             generator: torch.Generator | None = None) -> Iterator[Batch]:
    """Yield `nbatches` Batches of random sequences over tokens 1..V-1 whose first token is the start symbol.

    Source and target are the same sequence, so a trained model learns to copy.
    """
    for _ in range(nbatches):
        data = torch.randint(1, V, size=(batch_size, seq_len), generator=generator)  # (B, L)
        data[:, 0] = COPY_START
        yield Batch(data, data.clone(), pad=COPY_PAD)
