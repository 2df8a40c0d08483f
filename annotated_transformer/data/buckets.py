"""Which sentences go together in a batch, how batches are split between ranks, and how they are padded.

Two plans:

    bucket     sort by length (random order among equal lengths), cut greedily so that a batch's
               padded size max(S, T+1) * B stays within `batch_tokens`, shuffle the batches.
               Sentences of one batch have nearly equal lengths, so padding is a few percent.
    notebook   the notebook's: a random permutation cut into batches of 32 sentences, each padded
               to 72 tokens (most positions are padding; kept for benchmarks and comparisons).

A plan is a pure function of (lengths, seed, epoch): every rank computes the same global plan
and takes its own share, with no communication.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .batch import Batch
from .vocab import PAD

NOTEBOOK_BATCH_SIZE = 32  # the notebook's batch_size
NOTEBOOK_PADDING = 72  # the notebook's max_padding


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator of one epoch: the same on every rank and after every restart."""
    return np.random.default_rng([int(seed), int(epoch)])


def bucket_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                   rng: np.random.Generator | None = None,
                   served: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray]:
    """Length-bucketed batches of sentence indices, each within `batch_tokens` padded positions of `src_lens`/`tgt_lens`.

    The padded size of a batch is max(S, T+1) * B, with S and T+1 its longest source and target
    (both counting <s> and </s>). A sentence longer than the whole budget gets a batch of its own.
    With `rng`, sentences of equal lengths are shuffled and the batch order is random; without,
    the plan is deterministic (evaluation). `served`: the source and target lengths of the ids this
    epoch actually serves (subword sampling's): the batches keep the sizes cut on `src_lens` and
    `tgt_lens` (so every epoch has the same batches of the same number of sentences), but are
    filled in the order of the served lengths, so a batch holds sentences of nearly equal served length.
    """
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    n = len(src_lens)
    if n == 0:
        return []
    width = np.maximum(src_lens, tgt_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    # Sorting on the padded width first, then source and target lengths, keeps both sides of a
    # batch tight (3% padding on Multi30k at 4096 tokens; sorting on source length alone: 5%).
    # Only the order among identical (width, src, tgt) keys is random, so the cut points, and
    # hence the number of batches, are the same in every epoch.
    order = np.lexsort((tie, tgt_lens, src_lens, width))
    cuts, start, longest = [], 0, 0
    for pos, w in enumerate(width[order].tolist()):
        longest_with = max(longest, w)
        if pos > start and longest_with * (pos - start + 1) > batch_tokens:
            cuts.append((start, pos))
            start, longest_with = pos, w
        longest = longest_with
    cuts.append((start, n))
    if served is not None:
        s, t = (np.asarray(x) for x in served)
        order = np.lexsort((tie, t, s, np.maximum(s, t)))
    batches = [order[a:b] for a, b in cuts]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def notebook_batches(n: int, rng: np.random.Generator | None = None,
                      batch_size: int = NOTEBOOK_BATCH_SIZE) -> list[np.ndarray]:
    """The notebook's plan: a random permutation (or the file order, without `rng`) cut into fixed-size batches."""
    order = rng.permutation(n) if rng is not None else np.arange(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def shard(batches: Sequence[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's batches: every rank gets exactly ceil(len / world_size) of them.

    Equal counts matter: a DDP rank that ran out of batches first would wait forever in the
    gradient all-reduce of the others. The last round is filled by wrapping around to the first
    (shuffled) batches, so a few sentences are seen twice in that epoch, none is skipped.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if not batches:
        return []
    per_rank = math.ceil(len(batches) / world_size)
    return [batches[(rank + k * world_size) % len(batches)] for k in range(per_rank)]


def padding_fraction(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray,
                     pad_to: int | None = None) -> float:
    """Share of source+target positions that are padding, over all `batches` (pad_to: fixed width)."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    real = positions = 0
    for b in batches:
        s, t = src_lens[b], tgt_lens[b]
        if pad_to is not None:  # longer sentences are cut to the fixed width
            s, t = np.minimum(s, pad_to), np.minimum(t, pad_to)
        real += int(s.sum() + t.sum())
        positions += len(b) * ((pad_to or int(s.max())) + (pad_to or int(t.max())))
    return 1.0 - real / positions if positions else 0.0


def pad_rows(rows: Sequence[Sequence[int]], pad: int = PAD, width: int | None = None) -> torch.Tensor:
    """A (B, width) int64 tensor of `rows`, right-padded (width: the longest row, or fixed and cutting longer rows)."""
    width = width if width is not None else max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for k, row in enumerate(rows):
        row = row[:width]
        out[k, : len(row)] = row
    return torch.from_numpy(out)


class PadCollate:
    """Turn a list of (src ids, tgt ids) pairs into a Batch with masks (a picklable collate_fn).

    `width` None pads to the longest sentence of the batch; a number pads (and cuts) every batch
    to that width, as the notebook's collate does with max_padding=72.
    """

    def __init__(self, pad: int = PAD, width: int | None = None) -> None:
        self.pad, self.width = pad, width

    def __call__(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Batch:
        src = pad_rows([p[0] for p in pairs], self.pad, self.width)  # (B, S)
        tgt = pad_rows([p[1] for p in pairs], self.pad, self.width)  # (B, T+1)
        return Batch(src, tgt, pad=self.pad)
