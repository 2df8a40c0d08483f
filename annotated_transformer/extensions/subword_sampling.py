"""Subword regularisation (Kudo 2018): every epoch, each training sentence in a freshly sampled segmentation.

A unigram SentencePiece model scores every way of cutting a sentence into pieces; training on draws
from that distribution instead of the single best cut shows the model the same sentence in many
spellings, a regulariser for small corpora that costs no extra step. Validation, test and decoding
keep the best segmentation.

The epoch's batches keep the sizes cut on the best segmentation's lengths, so an epoch has the same
number of batches whatever is drawn (the schedule and mid-epoch resume depend on that), but they are
filled in the order of the sampled lengths (`TrainLoader(plan_on_served=True)`), so the sentences of
a batch have nearly equal sampled lengths: padding 3.0% on Multi30k at alpha 0.5 over the lattice,
where filling by the best lengths gave 14.9% (docs/extensions.md). Sampled segmentations are a
little longer (alpha 0.1 over the 64 best: about 1.1x the pieces), so a batch holds that many more
tokens. The draws are a pure function of (train.seed, epoch), so a resumed run sees the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.text import TextPipeline
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, not_negative, param


@dataclass
class SubwordSamplingConfig:
    """Subword regularisation (extensions/subword_sampling.py): every epoch a freshly sampled segmentation of each
    training sentence; off by default."""

    alpha: float = param(0.0, "SentencePiece sampling (Kudo 2018): segmentations drawn with probability proportional "
                         "to P(x)^alpha, so a smaller alpha gives more varied ones (0: off, the best segmentation "
                         "every epoch; needs data.tokenizer=spm)")
    nbest: int = param(64, "sample among this many best segmentations (-1: the whole lattice)")
    sides: str = param("both", "which side of each training pair is resegmented: 'both', 'src' or 'tgt'",
                       choices=("both", "src", "tgt"))


class SampledSegmentation:
    """Callable: epoch -> the training split's ids, the chosen sides segmented by sampling."""

    def __init__(self, cfg: SubwordSamplingConfig, text: TextPipeline, src_text: list[str], tgt_text: list[str],
                 src: list[np.ndarray], tgt: list[np.ndarray], seed: int) -> None:
        self.cfg, self.text, self.seed = cfg, text, seed
        self.texts = {"src": src_text, "tgt": tgt_text}
        self.best = {"src": src, "tgt": tgt}  # the cached best segmentation, for the sides left alone

    def side(self, side: str, epoch: int) -> list[np.ndarray]:
        """One side's ids for `epoch`: sampled, truncated to data.max_sentence_len like the cached ones."""
        if self.cfg.sides not in ("both", side):
            return self.best[side]
        # One seed per (run seed, epoch, side): large odd multipliers keep neighbouring seeds' draws apart.
        seed = self.seed * 1_000_003 + epoch * 7_919 + (side == "tgt")
        rows = self.text.sampled_ids_many(self.texts[side], side, self.cfg.alpha, self.cfg.nbest, seed)
        return [np.asarray(self.text.truncate(ids), dtype=np.int64) for ids in rows]

    def __call__(self, epoch: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self.side("src", epoch), self.side("tgt", epoch)


def sampled_segmentation(cfg: SubwordSamplingConfig, data, seed: int) -> SampledSegmentation | None:
    """The per-epoch resegmentation of `data`'s (a TranslationData) training split, or None when the switch is off."""
    if cfg.alpha == 0.0:
        return None
    train = data.splits["train"]
    return SampledSegmentation(cfg, data.text, train.src_text, train.tgt_text, train.src, train.tgt, seed)


def validate(cfg: CoreConfig) -> None:
    """The subword_sampling section's rules, and what they need from the data."""
    sw, d = cfg.subword_sampling, cfg.data
    not_negative({"subword_sampling.alpha": sw.alpha}, " (0: off)")
    if sw.alpha and (d.dataset == "copy" or d.tokenizer != "spm"):
        raise ConfigError("subword_sampling needs SentencePiece subwords: set data.tokenizer=spm "
                          "(and translation data), or subword_sampling.alpha=0")
    if sw.nbest == 0 or sw.nbest == 1 or sw.nbest < -1:
        raise ConfigError(f"subword_sampling.nbest must be -1 (the whole lattice) or at least 2, got {sw.nbest}")


EXTENSION = Extension(
    name="subword_sampling", section=SubwordSamplingConfig, help="subword regularisation", order=50,
    kind="resegmentation", on=lambda section: section.alpha != 0.0,
    # the first resegmentation: it reads the training text itself
    install=lambda cfg, data, resegment: sampled_segmentation(cfg.subword_sampling, data, cfg.train.seed),
    validate=validate, changes_lengths=True,
)
