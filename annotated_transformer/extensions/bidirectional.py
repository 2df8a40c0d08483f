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

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, param

Ids = Sequence[np.ndarray]
EpochIds = Callable[[int], tuple[Ids, Ids]]


@dataclass
class BidirectionalConfig:
    """Bidirectional training (extensions/bidirectional.py): pairs also served English -> German in the first
    epochs; off by default."""

    epochs: int = param(0, "in each of the first this many epochs every training pair is served reversed (its "
                        "target as the source, its source as the target) with probability `rate`, drawn afresh each "
                        "epoch (Ding et al. 2021 pretrain on both directions for a third of the run; 0: off). Needs "
                        "the shared vocabulary of data.tokenizer=spm; with subword sampling, its `sides` name the "
                        "languages, resegmented before the reversal")
    rate: float = param(0.5, "probability that a pair is reversed in those epochs")


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

    @property
    def epoch_note(self) -> str:
        """What the run's log says of the latest epoch served (nothing once no pair is reversed)."""
        return f"{self.reversed_share:.0%} of the training pairs served reversed (bidirectional training)" \
            if self.reversed_share else ""

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


def install(cfg: CoreConfig, data: Any, resegment: EpochIds | None) -> DirectionSampling | None:
    """`resegment`'s ids (subword sampling's), or else the cached ones of `data` (a TranslationData), with pairs
    reversed in the first bidirectional.epochs epochs."""
    train = data.splits["train"]
    base = resegment or (lambda epoch: (train.src, train.tgt))
    bi = cfg.bidirectional
    return direction_sampling(base, bi.epochs, bi.rate, cfg.train.seed)


def validate(cfg: CoreConfig) -> None:
    """The bidirectional section's rules, and what they need from the data and the run's length."""
    bi, d, epochs = cfg.bidirectional, cfg.data, cfg.train.epochs
    if bi.epochs < 0:
        raise ConfigError(f"bidirectional.epochs must be >= 0 (0: off), got {bi.epochs}")
    if bi.epochs and not 0 < bi.rate <= 1:
        raise ConfigError(f"bidirectional.rate must be in (0, 1] (0.5 serves half the pairs reversed), got {bi.rate}")
    if bi.epochs >= epochs > 0:
        raise ConfigError(f"bidirectional.epochs ({bi.epochs}) must be below train.epochs ({epochs}): "
                          f"the last epochs train the source -> target direction alone")
    if bi.epochs and (d.dataset == "copy" or d.tokenizer != "spm"):
        raise ConfigError("bidirectional training reads each pair both ways, which needs one vocabulary for "
                          "both languages: set data.tokenizer=spm (and translation data), or "
                          "bidirectional.epochs=0")


EXTENSION = Extension(
    name="bidirectional", section=BidirectionalConfig, help="bidirectional training", order=90,
    kind="resegmentation", on=lambda section: section.epochs != 0, install=install, validate=validate,
)
