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

import numpy as np

from ..config import SubwordSamplingConfig
from ..data.text import TextPipeline

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
