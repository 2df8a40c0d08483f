"""Model FLOPs of a training step: the count behind MFU (lab/benchmark.py) and a run's training compute.

A run's compute (`train_flops` in metrics.jsonl) sums this count over the sentences of its optimizer
steps; unlike minutes, it is the same on every machine, so recipes measured on different CPUs compare.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def train_step_flops(d_model: int, d_ff: int, N: int, tgt_vocab: int, src_lens: Sequence[int] | np.ndarray,
                     tgt_lens: Sequence[int] | np.ndarray, N_dec: int | None = None) -> float:
    """Matmul FLOPs of one training step on these sentences: 3x the forward pass (backward = 2x).

    Per sentence with S source and T target positions (no padding), per layer: encoder self-attention
    4 S d^2 projections + 2 S^2 d scores and mixing, feed-forward 2 S d d_ff; decoder self-attention
    4 T d^2 + 2 T^2 d, source attention 2 T d^2 + 2 S d^2 + 2 T S d, feed-forward 2 T d d_ff; then the
    generator T d V. Each multiply-add counts 2. The decoder has `N_dec` layers (default N).
    """
    d = d_model
    S = np.asarray(src_lens, dtype=np.float64)  # (n,) float: no overflow on a whole epoch of sentences
    T = np.asarray(tgt_lens, dtype=np.float64)  # (n,)
    enc = 4 * S * d * d + 2 * S * S * d + 2 * S * d * d_ff
    dec = 4 * T * d * d + 2 * T * T * d + 2 * T * d * d + 2 * S * d * d + 2 * T * S * d + 2 * T * d * d_ff
    return 3 * 2 * float((N * enc + (N_dec or N) * dec + T * d * tgt_vocab).sum())
