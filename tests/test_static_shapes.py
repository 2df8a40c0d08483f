"""Static batch shapes (data.static_shapes): a few fixed (rows, width) shapes, little padding, every sentence once
an epoch, the same plan on every rank and after a resume, and today's bucket plan wherever the key leaves them off."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from annotated_transformer.data import PAD, TranslationData, load_translation_data
from annotated_transformer.data.translation_data import Split
from annotated_transformer.data.buckets import (
    PadCollate,
    ShapedPadCollate,
    ShapedPairs,
    bucket_batches,
    epoch_rng,
    shaped_padding_fraction,
    static_batches,
    width_ladder,
)
from annotated_transformer.data.loader import static_shapes_on
from annotated_transformer.runtime.errors import DataError
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute
from annotated_transformer.fast import FusedAttention, swap_class
from annotated_transformer.model import MultiHeadedAttention, make_model

MAX_SHAPES = 24  # what a GPU compiles or captures once each: "a few dozen at most"
MAX_PADDING = 0.15  # share of source+target positions that are not real tokens, filler rows included
BUDGETS = (2048, 4096, 16384)  # base.yaml's batch, the default, and a large GPU batch


def with_data(data: TranslationData, **changes) -> TranslationData:
    """The same data with other data settings (no reloading)."""
    return dataclasses.replace(data, config=dataclasses.replace(data.config, **changes))


@pytest.fixture(scope="module")
def part(multi30k_data) -> TranslationData:
    """The data with its first 6000 training pairs (an epoch of the loader in well under a second)."""
    t, n = multi30k_data.splits["train"], 6000
    train = Split("train", t.src_text[:n], t.tgt_text[:n], t.src.subset(np.arange(n)), t.tgt.subset(np.arange(n)))
    return dataclasses.replace(multi30k_data, splits={**multi30k_data.splits, "train": train})


def epoch_batches(loader, epoch: int) -> list:
    loader.set_epoch(epoch)
    return list(loader)


def real_rows(batch) -> torch.Tensor:
    """Which rows hold a sentence: a filler row has nothing to predict."""
    return (batch.tgt_y != PAD).any(dim=1)


def batch_pairs(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (source, target) id tuples of a batch's sentences, padding and filler rows removed."""
    keep = real_rows(batch)
    tgt_full = torch.cat([batch.tgt[:, :1], batch.tgt_y], dim=1)  # (B, W): <s> ... </s>
    strip = lambda t: [tuple(x for x in r if x != PAD) for r in t[keep].tolist()]  # noqa: E731
    return list(zip(strip(batch.src), strip(tgt_full)))


def split_pairs(split) -> Counter:
    return Counter((tuple(s.tolist()), tuple(t.tolist())) for s, t in zip(split.src, split.tgt))


def shape(batch) -> tuple[int, int]:
    """(rows, width) of a static batch; the decoder reads width - 1 target positions."""
    return batch.src.size(0), batch.src.size(1)


def check_plan(src_lens: np.ndarray, tgt_lens: np.ndarray, budget: int) -> tuple[float, int]:
    """A static plan's invariants on these lengths; returns its padding share and number of shapes."""
    plan = static_batches(src_lens, tgt_lens, budget, epoch_rng(3, 0))
    ids = np.concatenate([b.ids for b in plan])
    assert np.array_equal(np.sort(ids), np.arange(len(src_lens)))  # every sentence once, none carried over
    assert all(b.rows * b.width <= budget for b in plan)
    assert all(np.maximum(src_lens, tgt_lens)[b.ids].max() <= b.width for b in plan)
    assert all(b.rows - 1 <= len(b.ids) <= b.rows for b in plan)  # at most one filler row a batch
    return shaped_padding_fraction(plan, src_lens, tgt_lens), len({(b.rows, b.width) for b in plan})


# --------------------------------------------------------------------------- the plan on real and synthetic lengths


@pytest.mark.parametrize("budget", BUDGETS)
def test_few_shapes_and_little_padding_on_multi30k_words(multi30k_data, budget):
    train = multi30k_data.splits["train"]
    padding, shapes = check_plan(train.src_lens, train.tgt_lens, budget)
    assert shapes <= MAX_SHAPES and padding <= MAX_PADDING


def test_the_data_line_describes_the_plan_the_loader_takes(tiny_config):
    """data.static_shapes=true: the data's summary counts the static plan's batches, shapes and padding."""
    from annotated_transformer.data.translation_data import stats_summary

    lines: list[str] = []
    data = load_translation_data(tiny_config("data.static_shapes=true"), log=lines.append)
    line = stats_summary(data.stats)
    loader = data.train_loader(seed=tiny_config().train.seed, pin_memory=False)
    assert loader.static_shapes and data.stats["batches_per_epoch"] == len(loader)
    shapes = data.stats["static_shapes"]
    assert f"bucket batching in {shapes} static shapes: {len(loader)} batches/epoch" in line
    assert shapes == len(loader.shapes())
    bucket = data.stats["batches_per_epoch_bucket"]
    assert bucket != len(loader) and f"{bucket} batches/epoch" in stats_summary(load_translation_data(
        tiny_config(), log=None).stats)


def test_under_auto_the_data_line_counts_the_plan_of_the_device(tiny_config):
    """data.static_shapes=auto: a CUDA run's data line counts the static plan's batches, a CPU run's the buckets'."""
    from annotated_transformer.harness.distributed import DistInfo
    from annotated_transformer.harness.tasks import build_task

    static = load_translation_data(tiny_config("data.static_shapes=true"), log=None).stats
    bucket = load_translation_data(tiny_config("data.static_shapes=false"), log=None).stats
    for cuda, plan in ((True, static), (False, bucket)):
        lines: list[str] = []
        task = build_task(tiny_config("data.static_shapes=auto"), DistInfo(), log=lines.append, cuda=cuda)
        stats = task.data.stats
        assert task.static is cuda  # the plan the task's loader takes, decided once
        assert stats["batches_per_epoch"] == plan["batches_per_epoch"] != bucket["batches_per_epoch_notebook"]
        assert stats.get("static_shapes") == plan.get("static_shapes")
        assert f"{plan['batches_per_epoch']} batches/epoch" in lines[-1]
    assert static["batches_per_epoch"] != bucket["batches_per_epoch"] and static["static_shapes"]


@pytest.mark.slow
def test_few_shapes_and_little_padding_on_multi30k_subwords(tiny_config):
    """base.yaml's tokenisation: one SentencePiece vocabulary of 8000 pieces."""
    data = load_translation_data(tiny_config("data.tokenizer=spm", "data.spm_vocab_size=8000"), log=None)
    train = data.splits["train"]
    for budget in BUDGETS:
        padding, shapes = check_plan(train.src_lens, train.tgt_lens, budget)
        assert shapes <= MAX_SHAPES and padding <= MAX_PADDING, budget


@pytest.mark.parametrize("budget", [2048, 16384])
def test_few_shapes_and_little_padding_on_long_uneven_sentences(budget):
    """Longer sentences than Multi30k's (up to data.max_sentence_len's 128), the two sides of a pair apart by ~10%."""
    rng = np.random.default_rng(0)
    base = np.exp(rng.normal(np.log(28), 0.5, 40_000))
    src = np.clip(np.rint(base), 3, 128).astype(np.int64)
    tgt = np.clip(np.rint(base * np.exp(rng.normal(0, 0.1, base.size))), 3, 128).astype(np.int64)
    padding, shapes = check_plan(src, tgt, budget)
    assert shapes <= MAX_SHAPES and padding <= MAX_PADDING


def test_shapes_and_batch_count_depend_on_the_lengths_only(multi30k_data):
    train = multi30k_data.splits["train"]
    plans = [static_batches(train.src_lens, train.tgt_lens, 2048, epoch_rng(seed, epoch))
             for seed, epoch in [(1, 0), (1, 1), (2, 0)]]
    assert len({len(p) for p in plans}) == 1
    assert len({tuple(sorted(Counter((b.rows, b.width) for b in p).items())) for p in plans}) == 1
    assert [b.ids.tolist() for b in plans[0]] != [b.ids.tolist() for b in plans[1]]


def test_served_lengths_fill_the_groups_planned_on_the_cached_ones(multi30k_data):
    """Subword sampling's case: the epoch's sampled lengths order the sentences, the cached ones fix the shapes."""
    train = multi30k_data.splits["train"]
    src, tgt = train.src_lens, train.tgt_lens
    plan = static_batches(src, tgt, 2048, epoch_rng(4, 2))
    same = static_batches(src, tgt, 2048, epoch_rng(4, 2), served=(src, tgt))
    assert all(np.array_equal(a.ids, b.ids) and a[1:] == b[1:] for a, b in zip(plan, same))
    longer = (src + np.random.default_rng(0).integers(0, 4, len(src)), tgt)
    sampled = static_batches(src, tgt, 2048, epoch_rng(4, 2), served=longer)
    layout = lambda p: Counter((b.rows, b.width, len(b.ids)) for b in p)  # noqa: E731
    assert layout(sampled) == layout(plan)
    assert np.array_equal(np.sort(np.concatenate([b.ids for b in sampled])), np.arange(len(src)))
    # filled in the order of the served widths: no group holds a sentence wider than one of a later group
    served_width = np.maximum(*longer)
    by_width = {}
    for b in sampled:
        lo, hi = by_width.get(b.width, (np.inf, 0))
        by_width[b.width] = (min(lo, served_width[b.ids].min()), max(hi, served_width[b.ids].max()))
    bounds = [by_width[w] for w in sorted(by_width)]
    assert all(hi <= lo for (_, hi), (lo, _) in zip(bounds, bounds[1:]))


def test_the_widest_group_is_made_up_with_filler_rows():
    # 10 sentences of width 32 (a ladder width): at most 3 rows of 32 in 100 tokens -> 4 batches of 3 rows, two of
    # them with a filler row
    lens = np.full(10, 32)
    plan = static_batches(lens, lens, 100, epoch_rng(0, 0))
    assert sorted(len(b.ids) for b in plan) == [2, 2, 3, 3] and {(b.rows, b.width) for b in plan} == {(3, 32)}


# --------------------------------------------------------------------------- the loader, forced on on the CPU


@pytest.fixture(scope="module")
def static_2048(part):
    """The training loader with data.static_shapes=true at base.yaml's 2048 tokens, and its first two epochs."""
    loader = with_data(part, batch_tokens=2048, static_shapes=True).train_loader(seed=7)
    return loader, [epoch_batches(loader, 0), epoch_batches(loader, 1)]


def test_loader_serves_every_sentence_once_in_the_planned_shapes(part, static_2048):
    loader, epochs = static_2048
    assert loader.static_shapes
    expected = split_pairs(part.splits["train"])
    planned = {(b.rows, b.width) for b in loader.sampler.global_plan(0)}
    for batches in epochs:
        assert len(batches) == len(loader)
        assert Counter(p for b in batches for p in batch_pairs(b)) == expected
        assert {shape(b) for b in batches} == planned and len(planned) <= MAX_SHAPES
        for b in batches:
            rows, width = shape(b)
            assert b.tgt.shape == (rows, width - 1) and rows * width <= 2048
            assert b.ntokens == int((b.tgt_y != PAD).sum()) and int(real_rows(b).sum()) >= rows - 1
    # the padding share of the tensors themselves, filler rows included
    batches = epochs[0]
    real = sum(int((b.src != PAD).sum()) + int((b.tgt_y != PAD).sum()) + int(real_rows(b).sum()) for b in batches)
    positions = sum(b.src.numel() + b.tgt_y.numel() + len(b) for b in batches)
    assert 1 - real / positions <= MAX_PADDING


def test_loader_plan_is_a_pure_function_of_seed_and_epoch(part, static_2048):
    _, epochs = static_2048
    again = epoch_batches(with_data(part, batch_tokens=2048, static_shapes=True).train_loader(seed=7), 1)
    assert all(torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt) for a, b in zip(again, epochs[1]))
    assert len(again) == len(epochs[1])
    assert [b.src[0].tolist() for b in epochs[0]] != [b.src[0].tolist() for b in epochs[1]]  # reshuffled


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_mid_epoch_resume_with_static_shapes(part, num_workers, mid_epoch_resume):
    data = with_data(part, batch_tokens=2048, static_shapes=True, num_workers=num_workers)
    state, _, _ = mid_epoch_resume(lambda: data.train_loader(seed=11), epoch=2, taken=17)
    # a run saved with static shapes does not resume into the bucket plan (data.static_shapes=auto on a CPU)
    with pytest.raises(DataError, match="data.static_shapes=true"):
        with_data(part, batch_tokens=2048).train_loader(seed=11).load_state_dict(state)


def test_reversed_pairs_of_bidirectional_training_keep_the_planned_shapes(part):
    from annotated_transformer.data.loader import TrainLoader
    from annotated_transformer.extensions.bidirectional import DirectionSampling

    train = part.splits["train"]
    flips = DirectionSampling(lambda epoch: (train.src, train.tgt), epochs=1, rate=0.5, seed=3)
    loader = TrainLoader(train.src, train.tgt, batch_tokens=2048, seed=3, resegment=flips, static_shapes=True)
    planned = {(b.rows, b.width) for b in loader.sampler.global_plan(0)}
    batches = epoch_batches(loader, 0)
    assert 0.4 < flips.reversed_share < 0.6 and {shape(b) for b in batches} == planned
    flipped = flips.reversed_rows(0, len(train))
    expected = Counter((tuple(t.tolist()), tuple(s.tolist())) if f else (tuple(s.tolist()), tuple(t.tolist()))
                       for s, t, f in zip(train.src, train.tgt, flipped))
    assert Counter(p for b in batches for p in batch_pairs(b)) == expected


def test_ranks_get_equal_shares_from_one_set_of_shapes(part):
    data = with_data(part, batch_tokens=2048, static_shapes=True)
    world = 3
    per_rank = [epoch_batches(data.train_loader(seed=5, rank=r, world_size=world), 4) for r in range(world)]
    planned = {(b.rows, b.width) for b in data.train_loader(seed=5).sampler.global_plan(4)}
    assert len({len(b) for b in per_rank}) == 1
    assert {shape(b) for batches in per_rank for b in batches} <= planned
    seen = Counter(p for batches in per_rank for b in batches for p in batch_pairs(b))
    assert set(seen) == set(split_pairs(data.splits["train"]))  # every sentence on some rank


# --------------------------------------------------------------------------- off: today's plan, bit for bit


def test_auto_on_a_cpu_is_the_bucket_plan_exactly(multi30k_data, part):
    train = multi30k_data.splits["train"]
    for setting in ("auto", False):
        sampler = with_data(multi30k_data, batch_tokens=2048, static_shapes=setting).train_loader(seed=9).sampler
        assert not sampler.static
        for epoch in (0, 3):
            plan = bucket_batches(train.src_lens, train.tgt_lens, 2048, epoch_rng(9, epoch))
            got = sampler.global_batches(epoch)
            assert len(got) == len(plan) and all(np.array_equal(a, b) for a, b in zip(got, plan))
    # and the batches themselves, as PadCollate pads them
    train = part.splits["train"]
    loader = with_data(part, batch_tokens=2048, static_shapes="auto").train_loader(seed=9)
    served = epoch_batches(loader, 3)
    plan = bucket_batches(train.src_lens, train.tgt_lens, 2048, epoch_rng(9, 3))
    assert len(served) == len(plan)
    collate = PadCollate(PAD)
    for got, ids in zip(served, plan):
        want = collate([(train.src[i], train.tgt[i]) for i in ids])
        assert torch.equal(got.src, want.src) and torch.equal(got.tgt, want.tgt)


def test_the_first_translator_trains_on_static_shapes_on_the_cpu_too():
    """cpu_15min.yaml sets them: on a CPU it is what bounds the run's memory (oneDNN's kernels for a few shapes)."""
    from annotated_transformer.config import load_config

    assert static_shapes_on(load_config("cpu_15min").data.static_shapes, cuda=False)
    assert not static_shapes_on(load_config("cpu_45min").data.static_shapes, cuda=False)  # measured on buckets


def test_auto_turns_static_shapes_on_for_cuda_unless_lengths_vary():
    assert static_shapes_on("auto", cuda=True) and not static_shapes_on("auto", cuda=False)
    assert not static_shapes_on("auto", cuda=True, lengths_vary=True)  # subword sampling
    assert static_shapes_on(True, cuda=False) and not static_shapes_on(False, cuda=True)


# --------------------------------------------------------------------------- filler rows and widening


@pytest.mark.parametrize("fused", [False, True])
def test_filler_rows_change_neither_loss_nor_gradients(fused):
    torch.manual_seed(0)
    model = make_model(20, 20, N=1, d_model=32, d_ff=64, h=4, dropout=0.0)
    if fused:  # in float64: the fused CPU kernel splits its sums by batch size, below any float32 bound's reach
        swap_class(model, MultiHeadedAttention, FusedAttention)
        model.double()
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(20, PAD, 0.1))
    gen = np.random.default_rng(1)
    pairs = [([0, *gen.integers(4, 20, n), 1], [0, *gen.integers(4, 20, n + 1), 1]) for n in (3, 5, 6)]
    collate = ShapedPadCollate(PAD)

    def loss_and_grads(rows: int):
        batch = collate(ShapedPairs(pairs, rows, 9))
        model.zero_grad()
        loss, scaled = loss_compute(model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask), batch.tgt_y, 1.0)
        scaled.backward()
        return batch, loss, [p.grad.clone() for p in model.parameters()]

    plain, loss, grads = loss_and_grads(3)
    padded, loss_f, grads_f = loss_and_grads(5)
    assert padded.src.shape == (5, 9) and padded.ntokens == plain.ntokens
    assert torch.isfinite(loss_f) and torch.allclose(loss_f, loss, rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads_f, grads))


def test_sentences_longer_than_the_planned_width_widen_the_batch_instead_of_being_cut():
    long_pair = (list(range(4, 24)), list(range(4, 15)))  # 20 source ids in a batch planned 16 wide
    batch = ShapedPadCollate(PAD)(ShapedPairs([long_pair], 2, 16))
    assert batch.src.shape == (2, 21) and 21 in width_ladder(20).tolist()
    assert batch.src[0, :20].tolist() == long_pair[0]
