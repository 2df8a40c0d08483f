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

The training text is read from the corpus each epoch, not held, and sampled CHUNK sentences at a time into
one packed `RaggedIds` a side: at millions of sentences, text and ids as Python objects would take gigabytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from ..data.ids import RaggedIds
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


# Sentences sampled per SentencePiece call. Each call restarts the generator from its seed, so the first chunk
# draws with the epoch's seed (a corpus of up to CHUNK sentences, Multi30k's 29,000, is one call, as it always
# was) and every later chunk with a seed derived from it.
CHUNK = 100_000


def chunk_seed(seed: int, k: int) -> int:
    """The seed of chunk `k` of one side's sampling whose first chunk draws with `seed`."""
    return seed if k == 0 else int(np.random.SeedSequence([seed % 2**32, k]).generate_state(1)[0])


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """`lines` in lists of `size` (the last shorter), read as they are needed."""
    it = iter(lines)
    while chunk := list(islice(it, size)):
        yield chunk


class SampledSegmentation:
    """Callable: epoch -> the training split's ids, the chosen sides segmented by sampling.

    `train` is the training split (a Split: src_text, tgt_text, src, tgt); its text is read afresh each epoch.
    """

    def __init__(self, cfg: SubwordSamplingConfig, text: TextPipeline, train: Any, seed: int) -> None:
        self.cfg, self.text, self.train, self.seed = cfg, text, train, seed

    def side(self, side: str, epoch: int) -> Sequence[np.ndarray]:
        """One side's ids for `epoch`: sampled, truncated to data.max_sentence_len like the cached ones (the cached
        best segmentation for a side left alone)."""
        if self.cfg.sides not in ("both", side):
            return getattr(self.train, side)
        # One seed per (run seed, epoch, side): large odd multipliers keep neighbouring seeds' draws apart.
        seed = self.seed * 1_000_003 + epoch * 7_919 + (side == "tgt")
        lines = getattr(self.train, f"{side}_text")  # read from the corpus now
        sampled = (self.text.sampled_ids_many(chunk, side, self.cfg.alpha, self.cfg.nbest, chunk_seed(seed, k))
                   for k, chunk in enumerate(chunks(lines, CHUNK)))
        return RaggedIds.from_chunks(sampled, limit=self.text.max_sentence_len)

    def __call__(self, epoch: int) -> tuple[Sequence[np.ndarray], Sequence[np.ndarray]]:
        return self.side("src", epoch), self.side("tgt", epoch)


def sampled_segmentation(cfg: SubwordSamplingConfig, data, seed: int) -> SampledSegmentation | None:
    """The per-epoch resegmentation of `data`'s (a TranslationData) training split, or None when the switch is off."""
    if cfg.alpha == 0.0:
        return None
    return SampledSegmentation(cfg, data.text, data.splits["train"], seed)


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
