"""Which sentences go together in a batch, how batches are split between ranks, and how they are padded.

Three plans:

    bucket     sort by length (random order among equal lengths), cut greedily so that a batch's
               padded size max(S, T+1) * B stays within `batch_tokens`, shuffle the batches.
               Sentences of one batch have nearly equal lengths, so padding is a few percent.
    static     (`static_batches`, data.static_shapes) every batch has one of a few fixed shapes, so
               that a GPU can compile or capture the training step once per shape; see below.
    notebook   the notebook's: a random permutation cut into batches of 32 sentences, each padded
               to 72 tokens (most positions are padding; kept for benchmarks and comparisons).

A plan is a pure function of (lengths, seed, epoch): every rank computes the same global plan
and takes its own share, with no communication. Planning works on the length arrays alone, with
NumPy's sorts and one Python step per distinct width or per batch, never one per sentence, so
that a corpus of millions of sentences is planned anew each epoch without holding up training.

Static shapes. A batch is B rows of source and target both padded to one width W (the source
tensor (B, W), the target's (B, W) with <s> and </s>), W taken from a ladder of widths that grow
by a sixth (8, 9, 10, 11, 12, 14, 16, 18, 21, 24, 28, 32, 37, 43, 50, ...), and B fixed per
width, at most batch_tokens // W. One width for both sides, not a (source, target) pair of
buckets, because bidirectional training serves pairs reversed in some epochs: max(S, T+1) is the
same both ways round, so a plan cut on the cached lengths holds every epoch's reversed pairs.
Each sentence goes to the group of the smallest width that holds it; walking up the ladder:

  - a group with less than half a batch of sentences joins the next width's group (its
    sentences padded further), so no batch but the widest group's is less than half full;
  - a group of n sentences becomes k = ceil(n / (batch_tokens // W)) batches of B = n // k rows,
    and its n - k*B < k widest sentences join the next width's group;
  - the widest group keeps all its sentences: B = ceil(n / k), and the k*B - n (< k) missing rows
    are filler rows, at most one per batch: source and target both just <s>, so the target
    predicts nothing (no loss, no gradient, not counted in ntokens) and every attention row
    still has a position to attend to (no NaN from an all-masked row).

So every sentence is served exactly once per epoch: none is dropped or carried over to the next
epoch, which would make an epoch's plan depend on the epochs before it. The groups, and hence the
shapes and the number of batches, depend only on the lengths, never on the seed or the epoch: the
schedule's length and mid-epoch resume (the loader's state is "k batches of epoch e taken") hold.
The seed and the epoch choose which of equally wide sentences move up, how a group's sentences
are dealt into its batches, and the order of the batches. On Multi30k (spm, 8000 pieces) that
is 13-15 shapes and 10% padding at 2048 to 16384 tokens (the bucket plan: 3-8%), 6% of it from
padding the shorter side of each pair to the longer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .batch import Batch
from .vocab import BOS, PAD

NOTEBOOK_BATCH_SIZE = 32  # the notebook's batch_size
NOTEBOOK_PADDING = 72  # the notebook's max_padding
LADDER_START = 8  # the narrowest static width: shorter sentences are rare, and 8 positions cost little
LADDER_GROWTH = 6  # each static width is the one before plus a sixth of it (at least one)


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random generator of one epoch: the same on every rank and after every restart."""
    return np.random.default_rng([int(seed), int(epoch)])


def lexsort_by_tie(keys: Sequence[np.ndarray]) -> np.ndarray:
    """np.lexsort(keys) (the last key sorts first) where keys[0], the tie-breaker, is a permutation of 0..n-1.

    The same order, computed as one stable sort per key starting from the tie-breaker's order: NumPy sorts
    16-bit integers stably by radix, in linear time, which makes it several times faster than np.lexsort
    at millions of sentences.
    """
    tie, *rest = (np.asarray(key) for key in keys)
    order = np.empty_like(tie)
    order[tie] = np.arange(len(tie), dtype=tie.dtype)  # the indices in the tie-breaker's order
    for key in rest:
        k = key[order]
        if k.size and k.min() >= 0 and k.max() < 1 << 16:
            k = k.astype(np.uint16)
        order = order[np.argsort(k, kind="stable")]
    return order


def bucket_starts(width: np.ndarray, batch_tokens: int) -> np.ndarray:
    """Where each batch of the bucket plan starts among the sentences sorted by `width` (the first at 0).

    The greedy cut: a batch takes the next, widest so far, sentence while (its size + 1) * that width
    stays within `batch_tokens`; a sentence wider than the whole budget gets a batch of its own. The
    cut depends only on how many sentences have each width, so it is computed width by width.
    """
    width = np.asarray(width)
    n = len(width)
    starts, start, pos = [np.zeros(min(n, 1), dtype=np.int64)], 0, 0  # the open batch is start..pos-1
    for w, count in zip(*(a.tolist() for a in np.unique(width, return_counts=True))):
        # the most sentences of width w in a batch (of width w: zero-width ones never exceed a budget >= 0)
        most = max(1, int(batch_tokens // w)) if w > 0 else (n if batch_tokens >= 0 else 1)
        first = pos + max(0, most - (pos - start))  # the open batch fills up to `most` sentences first
        cuts = np.arange(first, pos + count, most, dtype=np.int64)
        if cuts.size:
            starts.append(cuts)
            start = int(cuts[-1])
        pos += count
    return np.concatenate(starts)


def bucket_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                   rng: np.random.Generator | None = None,
                   served: tuple[np.ndarray, np.ndarray] | None = None) -> list[np.ndarray]:
    """Length-bucketed batches of sentence indices, each within `batch_tokens` padded positions of the lengths.

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
    order = lexsort_by_tie((tie, tgt_lens, src_lens, width))
    if served is not None:
        s, t = (np.asarray(x) for x in served)
        order = lexsort_by_tie((tie, t, s, np.maximum(s, t)))
    batches = np.split(order, bucket_starts(width, batch_tokens)[1:])
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def notebook_batches(n: int, rng: np.random.Generator | None = None,
                      batch_size: int = NOTEBOOK_BATCH_SIZE) -> list[np.ndarray]:
    """The notebook's plan: a random permutation (or the file order, without `rng`) cut into fixed-size batches."""
    order = rng.permutation(n) if rng is not None else np.arange(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


class ShapedBatch(NamedTuple):
    """One batch of the static plan: its sentences, and the shape they are padded to."""

    ids: np.ndarray  # the sentence indices (rows - len(ids) filler rows come after them)
    rows: int  # B
    width: int  # W: source and target (<s> and </s> included) are both padded to W positions


class ShapedPairs(NamedTuple):
    """What `ShapedPadCollate` pads: a batch's (src ids, tgt ids) pairs and its shape."""

    pairs: list[tuple[Sequence[int], Sequence[int]]]
    rows: int
    width: int


def width_ladder(longest: int) -> np.ndarray:
    """The static widths, ascending, up to the first one that holds `longest` positions."""
    widths = [LADDER_START]
    while widths[-1] < longest:
        widths.append(widths[-1] + max(1, widths[-1] // LADDER_GROWTH))
    return np.asarray(widths, dtype=np.int64)


def static_groups(widths: np.ndarray, batch_tokens: int) -> list[tuple[int, int, int, int]]:
    """(width W, batches k, rows B, sentences n) of each static group, narrowest first (see the module docstring).

    `widths`: each sentence's max(source length, target length). A function of the length counts
    only, so every epoch (and every rank) has the same groups.
    """
    widths = np.asarray(widths)
    if len(widths) == 0:
        return []
    ladder = width_ladder(int(widths.max()))
    counts = np.bincount(np.searchsorted(ladder, widths), minlength=len(ladder)).tolist()
    last = max(j for j, c in enumerate(counts) if c)
    groups, pool = [], 0
    for j in range(last + 1):
        pool += counts[j]
        width = int(ladder[j])
        most = max(1, batch_tokens // width)  # a sentence longer than the budget gets a batch of its own
        if pool == 0 or (j < last and 2 * pool < most):
            continue  # less than half a batch: these sentences join the next width's group
        k = -(-pool // most)
        rows = pool // k if j < last else -(-pool // k)
        served = k * rows if j < last else pool
        groups.append((width, k, rows, served))
        pool -= served
    return groups


def static_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_tokens: int,
                   rng: np.random.Generator | None = None,
                   served: tuple[np.ndarray, np.ndarray] | None = None) -> list[ShapedBatch]:
    """The static-shape plan of `src_lens`/`tgt_lens`: batches of a few fixed (rows, width) shapes, each within
    `batch_tokens` padded positions a side (see the module docstring).

    With `rng`, which of equally wide sentences move up a group, how a group is dealt into batches,
    and the batch order are random; without, the plan is deterministic. `served`: the lengths this
    epoch actually serves (subword sampling's): the groups keep the shapes and sizes planned on
    `src_lens`/`tgt_lens`, but are filled in the order of the served lengths; a batch whose served
    sentences outgrow its width is padded to the next width of the ladder that holds them.
    """
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    n = len(src_lens)
    width = np.maximum(src_lens, tgt_lens)
    key = width if served is None else np.maximum(np.asarray(served[0]), np.asarray(served[1]))
    tie = rng.permutation(n) if rng is not None else np.arange(n)
    order = lexsort_by_tie((tie, key))  # narrowest first: each group takes the next sentences of this order
    batches, start = [], 0
    for w, k, rows, count in static_groups(width, batch_tokens):
        members = order[start:start + count]
        start += count
        if rng is not None:  # every row of the group is padded to w: any mix of its sentences costs the same
            members = rng.permutation(members)
        fillers = k * rows - count  # < k: the group's last `fillers` batches have one filler row each
        sizes = [rows] * (k - fillers) + [rows - 1] * fillers
        batches += [ShapedBatch(part, rows, w) for part in np.split(members, np.cumsum(sizes)[:-1])]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


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


def shaped_padding_fraction(batches: Sequence[ShapedBatch], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Share of source+target positions that are padding over a static plan's `batches`, filler rows included."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    real = sum(int(src_lens[b.ids].sum() + tgt_lens[b.ids].sum()) for b in batches)
    positions = sum(2 * b.rows * b.width for b in batches)
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


class ShapedPadCollate:
    """Turn a static batch (`ShapedPairs`) into a Batch of exactly its shape: (rows, width) source and target.

    The missing rows are filler rows, <s> alone on both sides: nothing to predict (ntokens and the loss
    ignore them), yet one position for every attention row. Served sentences longer than the planned
    width (subword sampling draws new lengths each epoch) widen the batch to the ladder's next width
    that holds them instead of being cut.
    """

    def __init__(self, pad: int = PAD, bos: int = BOS) -> None:
        self.pad, self.bos = pad, bos

    def __call__(self, shaped: ShapedPairs) -> Batch:
        longest = max((max(len(s), len(t)) for s, t in shaped.pairs), default=0)
        width = shaped.width if longest <= shaped.width else int(width_ladder(longest)[-1])
        filler = [self.bos]
        extra = [(filler, filler)] * (shaped.rows - len(shaped.pairs))
        pairs = list(shaped.pairs) + extra
        src = pad_rows([p[0] for p in pairs], self.pad, width)  # (B, W)
        tgt = pad_rows([p[1] for p in pairs], self.pad, width)  # (B, W): the model reads W-1 positions
        return Batch(src, tgt, pad=self.pad)
