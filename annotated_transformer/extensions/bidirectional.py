"""Bidirectional training (Ding et al. 2021): in the first epochs, a share of the training pairs served reversed.

German -> English and English -> German share one SentencePiece vocabulary and, with tied embeddings, one
embedding matrix, so a pair read backwards is one more training example for the same weights: the encoder
learns English sentences too, the decoder German ones, and the attention between them both ways. The
authors pretrain on both directions for the first third of the updates and then train the original one;
the input's language says which one to produce, so no tag is needed.

Here the epochs keep their batches: in each of the first `epochs` epochs every pair is reversed with
probability `rate` (a fresh draw each epoch), so an epoch costs what a plain one costs and the schedule,
the batch plan and mid-epoch resume are unchanged. The draws are a pure function of (train.seed, epoch),
so a resumed run sees the same ones. Validation, test and decoding stay German -> English.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Ids = Sequence[np.ndarray]
EpochIds = Callable[[int], tuple[Ids, Ids]]


class DirectionSampling:
    """Callable: epoch -> the training split's (src, tgt) ids, each pair reversed with probability `rate`
    while epoch < `epochs`, and `base(epoch)` untouched after."""

    def __init__(self, base: EpochIds, epochs: int, rate: float, seed: int) -> None:
        self.base, self.epochs, self.rate, self.seed = base, epochs, rate, seed
        self.reversed_share = 0.0  # the share of pairs the latest call reversed

    def reversed_rows(self, epoch: int, n: int) -> np.ndarray:
        """Which of the `n` pairs `epoch` serves reversed (a boolean mask; all False from epoch `epochs` on)."""
        if epoch >= self.epochs:
            return np.zeros(n, dtype=bool)
        # Its own stream per (run seed, epoch): independent of subword sampling's draws and of torch's RNG.
        return np.random.default_rng([self.seed, epoch, 0xB1D]).random(n) < self.rate

    def __call__(self, epoch: int) -> tuple[Ids, Ids]:
        src, tgt = self.base(epoch)
        flip = self.reversed_rows(epoch, len(src))
        self.reversed_share = float(flip.mean()) if len(flip) else 0.0
        if not flip.any():
            return src, tgt
        # Both sides are <s> ids </s> cut to the same max_sentence_len, so swapping them is a valid pair.
        return ([t if f else s for s, t, f in zip(src, tgt, flip)],
                [s if f else t for s, t, f in zip(src, tgt, flip)])


def direction_sampling(base: EpochIds, epochs: int, rate: float, seed: int) -> DirectionSampling | None:
    """`base`'s ids with pairs reversed in the first `epochs` epochs, or None when the switch is off (epochs 0)."""
    if epochs == 0:
        return None
    return DirectionSampling(base, epochs, rate, seed)
