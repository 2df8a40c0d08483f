"""Batch plans at scale: the width-by-width cut and the radix lexsort give exactly the plans of the per-sentence
loop they replaced; an epoch's plan, its token counts and its lengths take no Python step per sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from annotated_transformer.data import buckets
from annotated_transformer.data.buckets import (
    bucket_batches,
    bucket_starts,
    epoch_rng,
    lexsort_by_tie,
    notebook_batches,
    static_batches,
)
from annotated_transformer.data.ids import RaggedIds
from annotated_transformer.data.loader import EpochBatchSampler, TrainLoader


def reference_bucket_batches(src_lens, tgt_lens, batch_tokens, rng=None, served=None) -> list[np.ndarray]:
    """bucket_batches as it was before plans went width by width: np.lexsort and the greedy cut, one step a
    sentence (kept here as the reference the new plan must equal)."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    n = len(src_lens)
    if n == 0:
        return []
    width = np.maximum(src_lens, tgt_lens)
    tie = rng.permutation(n) if rng is not None else np.arange(n)
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


def lengths(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) lengths of `n` sentences drawn from one of several shapes of corpus."""
    g = np.random.default_rng(seed)
    if kind == "uniform":
        src, tgt = g.integers(3, 60, n), g.integers(3, 60, n)
    elif kind == "wmt":  # long-tailed, targets a little longer than their sources
        src = np.clip(np.round(g.lognormal(3.2, 0.55, n)), 3, 250).astype(np.int64)
        tgt = np.clip(np.round(src * g.normal(1.05, 0.15, n)), 3, 250).astype(np.int64)
    elif kind == "few":  # a handful of widths, many sentences each
        src, tgt = g.choice([4, 9, 30], n), g.choice([5, 9, 31], n)
    elif kind == "equal":
        src = tgt = np.full(n, 17)
    else:  # "giant": mostly short, a few longer than any budget below
        src, tgt = g.integers(3, 20, n), g.integers(3, 20, n)
        src[g.choice(n, 3, replace=False)] = 30_000
    return src.astype(np.int64), tgt.astype(np.int64)


def same_plan(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["uniform", "wmt", "few", "equal", "giant"])
@pytest.mark.parametrize("budget", [1, 40, 512, 4096, 25_000])
def test_the_width_by_width_cut_is_the_per_sentence_loops_cut(kind, budget):
    src, tgt = lengths(kind, 3000, seed=budget)
    assert same_plan(bucket_batches(src, tgt, budget), reference_bucket_batches(src, tgt, budget))
    for epoch in (0, 1):
        new = bucket_batches(src, tgt, budget, epoch_rng(5, epoch))
        assert same_plan(new, reference_bucket_batches(src, tgt, budget, epoch_rng(5, epoch)))
    served = lengths("uniform", 3000, seed=99)  # subword sampling: other lengths fill the same cut
    assert same_plan(bucket_batches(src, tgt, budget, epoch_rng(2, 3), served),
                     reference_bucket_batches(src, tgt, budget, epoch_rng(2, 3), served))


def test_the_cut_at_the_edges():
    assert len(bucket_starts(np.zeros(0, dtype=np.int64), 100)) == 0 and bucket_batches([], [], 100) == []
    assert bucket_starts(np.array([10]), 5).tolist() == [0]  # one sentence wider than the budget: its own batch
    # zero widths never reach a budget, and a budget below zero gives every sentence its own batch
    for widths, budget in (([0, 0, 0, 4, 4], 8), ([0, 0, 3], -1), ([2, 2, 2], 4.5)):
        w = np.asarray(widths)
        assert same_plan(bucket_batches(w, w, budget), reference_bucket_batches(w, w, budget))
    assert bucket_starts(np.array([0, 0, 0, 4, 4]), 8).tolist() == [0, 3]  # 4 rows of width 4 exceed 8


def test_the_radix_lexsort_is_numpys_lexsort():
    g = np.random.default_rng(0)
    n = 5000
    tie = g.permutation(n)
    for keys in ((g.integers(0, 50, n), g.integers(0, 9, n)),  # 16-bit keys: sorted by radix
                 (g.integers(-5, 5, n), g.integers(0, 1 << 40, n)),  # negative and wide keys: sorted as they are
                 (g.integers(0, 1 << 16, n),)):
        assert np.array_equal(lexsort_by_tie((tie, *keys)), np.lexsort((tie, *keys)))
    assert np.array_equal(lexsort_by_tie((np.arange(n), np.zeros(n, dtype=np.int64))), np.arange(n))


@pytest.mark.parametrize("kind", ["wmt", "giant"])
def test_static_and_notebook_plans_are_those_of_numpys_lexsort(kind, monkeypatch):
    src, tgt = lengths(kind, 3000, seed=1)
    served = lengths("wmt", 3000, seed=2)
    new = [static_batches(src, tgt, 2048, epoch_rng(3, e), s) for e, s in ((0, None), (1, served))]
    new.append(static_batches(src, tgt, 2048))
    monkeypatch.setattr(buckets, "lexsort_by_tie", np.lexsort)
    old = [static_batches(src, tgt, 2048, epoch_rng(3, e), s) for e, s in ((0, None), (1, served))]
    old.append(static_batches(src, tgt, 2048))
    for a, b in zip(new, old):
        assert [(x.rows, x.width) for x in a] == [(x.rows, x.width) for x in b]
        assert same_plan([x.ids for x in a], [x.ids for x in b])
    g = epoch_rng(4, 1)
    order = g.permutation(3000)
    assert same_plan(notebook_batches(3000, epoch_rng(4, 1)), [order[i:i + 32] for i in range(0, 3000, 32)])


@pytest.mark.parametrize("batching,static", [("bucket", False), ("bucket", True), ("notebook", False)])
def test_the_sampler_counts_the_batches_of_every_epoch_without_planning_one(batching, static):
    src, tgt = lengths("giant", 2000, seed=3)
    for budget in (64, 1000, 4096):
        sampler = EpochBatchSampler(src, tgt, batching=batching, batch_tokens=budget, seed=1, static=static)
        assert sampler._plan is None  # counted, not planned
        assert sampler._num_global == len(sampler.global_batches(0)) == len(sampler.global_batches(3))
    served = EpochBatchSampler(src, tgt, batching=batching, batch_tokens=1000, seed=1, static=static)
    plan = served.global_plan(2)
    assert served.global_plan(2) is plan  # made once per epoch
    served.served = (2, tgt, src)
    assert served.global_plan(2) is not plan  # new served lengths, a new plan


@pytest.mark.parametrize("world_size,batching", [(1, "bucket"), (2, "bucket"), (3, "notebook"), (2, "static")])
def test_token_counts_and_served_lengths_are_the_per_batch_sums(world_size, batching):
    src, tgt = lengths("wmt", 3000, seed=4)
    ids = [np.zeros(n, dtype=np.int64) for n in tgt]
    loader = TrainLoader(ids, ids, batching="notebook" if batching == "notebook" else "bucket", batch_tokens=900,
                         seed=2, world_size=world_size, static_shapes=batching == "static")
    loader.src_lens = src  # distinct source lengths, to tell the sides apart below
    lens = tgt if loader.width is None else np.minimum(tgt, loader.width)
    for epoch in (0, 1):
        plan = loader.sampler.global_batches(epoch)
        per_batch = [int(lens[b].sum()) - len(b) for b in plan]
        want = [sum(per_batch[(r + k * world_size) % len(plan)] for r in range(world_size))
                for k in range(len(loader))]
        assert loader.global_tokens(epoch) == want
    loader.set_epoch(1)
    plan = loader.sampler.global_batches(1)
    s, t = loader.lengths_served(2, len(loader))
    rows = np.concatenate([plan[i % len(plan)] for i in range(2 * world_size, len(loader) * world_size)])
    cut = (lambda x: x) if loader.width is None else (lambda x: np.minimum(x, loader.width))
    assert np.array_equal(s, cut(src[rows])) and np.array_equal(t, cut(tgt[rows]))


def python_lines_here(run) -> int:
    """How many lines of the package's data code run during `run()` (sys.settrace line events)."""
    package = str(Path(buckets.__file__).parent)
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(package) else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        run()
    finally:
        sys.settrace(before)
    return count


@pytest.mark.slow
@pytest.mark.parametrize("batching,static", [("bucket", False), ("bucket", True), ("notebook", False)])
def test_a_million_sentences_are_planned_without_a_python_step_per_sentence(batching, static, monkeypatch):
    n = 1_000_000
    src, tgt = lengths("wmt", n, seed=5)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(src, out=offsets[1:])
    ids = RaggedIds(np.broadcast_to(np.int32(7), (int(offsets[-1]),)), offsets)  # 30 million ids, none stored

    def no_sentence(*_):
        raise AssertionError("the plan read a sentence")

    monkeypatch.setattr(RaggedIds, "__getitem__", no_sentence)
    monkeypatch.setattr(RaggedIds, "__iter__", no_sentence)
    seen = {}

    def plan():
        loader = TrainLoader(ids, ids, batching=batching, batch_tokens=4096, seed=1, world_size=2,
                             static_shapes=static)
        seen.update(loader=loader, batches=loader.sampler.batches(3), totals=loader.global_tokens(3))
        loader.set_epoch(3)
        seen["lengths"] = loader.lengths_served(0, len(loader))

    lines = python_lines_here(plan)
    loader = seen["loader"]
    batches = len(loader.sampler.global_batches(3))
    assert 1000 < batches < 40_000
    assert lines < n // 4  # about a dozen lines per batch; the loop over sentences took four a sentence
    assert isinstance(loader.sampler.src_lens, np.ndarray) and loader.sampler.src_lens.shape == (n,)
    assert len(seen["totals"]) == len(seen["batches"]) == len(loader) == -(-batches // 2)
    assert all(isinstance(x, int) for x in seen["totals"][:5])
    assert seen["lengths"][0].dtype == np.int64 and len(seen["lengths"][0]) >= n
