"""The regularising extensions: subword sampling (a new segmentation of the training data every epoch) and
R-Drop (two dropout passes and a symmetric KL); each off by default and exact when off."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from annotated_transformer.config import load_config
from annotated_transformer.data.batch import Batch
from annotated_transformer.data.buckets import bucket_batches, epoch_rng, padding_fraction
from annotated_transformer.data.ids import RaggedIds
from annotated_transformer.data.loader import TrainLoader
from annotated_transformer.data.text import TextPipeline
from annotated_transformer.data.vocab import UNK
from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.extensions.bidirectional import DirectionSampling
from annotated_transformer.extensions.builder import build_resegmentation, build_training
from annotated_transformer.extensions.cutoff import CutoffObjective, build_cutoff, cut_tokens
from annotated_transformer.extensions.r_drop import RDropObjective, build_r_drop, symmetric_kl
from annotated_transformer.extensions import subword_sampling
from annotated_transformer.extensions.subword_sampling import SampledSegmentation, SubwordSamplingConfig
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute
from annotated_transformer.model import make_model

PAD, BOS, EOS, V = 2, 0, 1, 23


@pytest.fixture(scope="module")
def subwords(multi30k_data):
    """A small SentencePiece model on 3,000 Multi30k pairs, and those pairs' best-segmentation ids."""
    train = multi30k_data.splits["train"]
    src_text, tgt_text = train.src_text[:3000], train.tgt_text[:3000]
    text = TextPipeline.for_subwords(src_text, tgt_text, src_lang="de", tgt_lang="en", vocab_size=600,
                                     max_sentence_len=40)
    ids = {side: [np.asarray(text.truncate(r), dtype=np.int64) for r in text.ids_many(texts, side)]
           for side, texts in (("src", src_text), ("tgt", tgt_text))}
    return text, src_text, tgt_text, ids["src"], ids["tgt"]


def segmentation(subwords, seed: int = 3, **cfg) -> SampledSegmentation:
    text, src_text, tgt_text, src, tgt = subwords
    train = SimpleNamespace(src_text=src_text, tgt_text=tgt_text, src=src, tgt=tgt)  # what it reads of a Split
    return SampledSegmentation(SubwordSamplingConfig(**{"alpha": 0.1, **cfg}), text, train, seed)


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- subword sampling


@pytest.mark.slow
def test_sampled_segmentations_spell_the_same_sentences_and_repeat_for_the_same_seed_and_epoch(subwords):
    text, src_text, tgt_text, src, tgt = subwords
    reseg = segmentation(subwords)
    src0, tgt0 = reseg(0)
    assert not same(src0, src) and not same(tgt0, tgt)  # both sides drawn anew
    changed = np.mean([not np.array_equal(a, b) for a, b in zip(src0, src)])
    assert changed > 0.5  # alpha 0.1 over the 64 best: most sentences cut differently
    short = [i for i, ids in enumerate(src0) if len(ids) < 40][:200]  # untruncated rows detokenise exactly
    assert all(text.ids_to_text(src0[i], "src") == " ".join(src_text[i].split()) for i in short)
    assert all(ids[0] == BOS and ids[-1] == EOS and len(ids) <= 40 for ids in list(src0) + list(tgt0))
    segmentation(subwords, seed=9)(0)  # other draws in between do not disturb the next call's
    again = reseg(0)
    assert same(again[0], src0) and same(again[1], tgt0)
    assert not same(reseg(1)[0], src0)  # a new epoch, a new segmentation
    assert not same(segmentation(subwords, seed=4)(0)[0], src0)  # another run seed, other draws


@pytest.mark.slow  # about a second on 2 cores: the fast tier stays under a minute
def test_only_the_chosen_side_is_resegmented(subwords):
    _, _, _, src, tgt = subwords
    src_only = segmentation(subwords, sides="src")(0)
    assert not same(src_only[0], src) and src_only[1] is tgt
    tgt_only = segmentation(subwords, sides="tgt")(0)
    assert tgt_only[0] is src and not same(tgt_only[1], tgt)


@pytest.mark.slow
def test_sampling_reads_the_text_each_epoch_and_draws_todays_segmentations_in_chunks(subwords, monkeypatch):
    text, src_text, tgt_text, src, tgt = subwords
    reads = []

    class Train:  # a training split whose text is read from its files on each use, as the data cache's is
        @property
        def src_text(self):
            reads.append("src")
            return iter(src_text)  # the sampling only iterates

    train = Train()
    train.tgt = tgt
    reseg = SampledSegmentation(SubwordSamplingConfig(alpha=0.1, sides="src"), text, train, seed=3)
    assert reads == []  # nothing read before an epoch needs it
    whole = reseg(2)[0]
    assert reads == ["src"] and isinstance(whole, RaggedIds) and whole.limit == text.max_sentence_len
    # up to 100,000 sentences are one SentencePiece call: the draws the whole list always had
    seed = 3 * 1_000_003 + 2 * 7_919
    today = [text.truncate(r) for r in text.sampled_ids_many(src_text, "src", 0.1, 64, seed)]
    assert same(whole, [np.asarray(r, dtype=np.int64) for r in today])
    monkeypatch.setattr(subword_sampling, "CHUNK", 1000)  # larger corpora: later chunks draw with seeds of their own
    chunked = reseg(2)[0]
    assert same(chunked[:1000], whole[:1000]) and not same(chunked[1000:2000], whole[1000:2000])
    assert same(chunked, reseg(2)[0]) and len(chunked) == len(src_text)


@pytest.mark.slow
def test_the_loader_serves_each_epochs_segmentation_on_the_same_plan_and_resumes_with_it(subwords):
    _, _, _, src, tgt = subwords
    reseg = segmentation(subwords)
    plain = TrainLoader(src, tgt, batch_tokens=400, seed=5)
    sampled = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=reseg)
    assert len(sampled) == len(plain)  # planned on the best segmentation's lengths
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        sampled.set_epoch(epoch)
        want_src, want_tgt = reseg(epoch)
        rows = sampled.sampler.batches(epoch)
        for k, (a, b) in enumerate(zip(plain, sampled)):
            assert len(a) == len(b)  # the same sentences ...
            picked = rows[k]
            longest = max(len(want_src[i]) for i in picked)
            assert b.src.shape == (len(picked), longest)  # ... in this epoch's spelling
            assert all(np.array_equal(b.src[j, :len(want_src[i])].numpy(), want_src[i]) for j, i in enumerate(picked))
            assert b.ntokens == sum(len(want_tgt[i]) - 1 for i in picked)
            if k == 2:
                break
    sampled.set_epoch(1)
    it = iter(sampled)
    next(it), next(it)
    state = sampled.state_dict()
    expected = next(it)
    fresh = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=segmentation(subwords))
    fresh.load_state_dict(state)  # a new process: the epoch's draws are made again, alike
    assert next(iter(fresh)).src.equal(expected.src)


def test_batches_filled_by_the_served_lengths_keep_their_sizes_and_lose_most_padding(subwords):
    _, _, _, src, tgt = subwords
    best = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=segmentation(subwords, alpha=0.5, nbest=-1))
    served = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=segmentation(subwords, alpha=0.5, nbest=-1),
                         plan_on_served=True)
    best.set_epoch(1)
    served.set_epoch(1)
    a, b = best.sampler.global_batches(1), served.sampler.global_batches(1)
    assert [len(x) for x in a] == [len(x) for x in b]  # the same batches' sizes, in the same order
    assert np.array_equal(np.sort(np.concatenate(b)), np.arange(len(src)))  # every sentence once
    assert padding_fraction(b, served.src_lens, served.tgt_lens) < padding_fraction(a, best.src_lens, best.tgt_lens) / 2
    width = np.maximum(served.src_lens, served.tgt_lens)
    spans = sorted((int(width[x].min()), int(width[x].max())) for x in b)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))  # consecutive in served width
    it = iter(served)
    next(it), next(it)
    state, expected = served.state_dict(), next(it)
    fresh = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=segmentation(subwords, alpha=0.5, nbest=-1),
                        plan_on_served=True)
    fresh.load_state_dict(state)  # a new process plans the epoch on the same draws
    assert next(iter(fresh)).src.equal(expected.src)


def test_a_plan_filled_in_the_order_of_its_own_lengths_is_the_plain_plan():
    g = np.random.default_rng(0)
    s, t = g.integers(3, 40, 500), g.integers(3, 40, 500)
    plain = bucket_batches(s, t, 400, epoch_rng(1, 2))
    alike = bucket_batches(s, t, 400, epoch_rng(1, 2), served=(s, t))
    assert len(plain) == len(alike) and all(np.array_equal(x, y) for x, y in zip(plain, alike))


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_the_compute_count_sees_every_sentence_once_an_epoch_at_its_served_length(subwords):
    _, _, _, src, tgt = subwords
    reseg = segmentation(subwords)
    loader = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=reseg)
    loader.set_epoch(2)
    s, t = loader.lengths_served(0, len(loader))
    want_s, want_t = (np.sort([len(x) for x in side]) for side in reseg(2))
    assert np.array_equal(np.sort(s), want_s) and np.array_equal(np.sort(t), want_t)
    first, rest = loader.lengths_served(0, 3), loader.lengths_served(3, len(loader))
    assert len(first[0]) + len(rest[0]) == len(src)


def test_subword_sampling_off_leaves_the_cached_ids_and_on_resegments_the_training_split(subwords):
    text, src_text, tgt_text, src, tgt = subwords
    train = SimpleNamespace(src_text=src_text, tgt_text=tgt_text, src=src, tgt=tgt)
    data = SimpleNamespace(text=text, splits={"train": train})
    assert build_resegmentation(load_config("tiny", ["data.tokenizer=spm"]), data) is None  # off
    plain = TrainLoader(src, tgt, batch_tokens=400, seed=5)
    plain.set_epoch(3)
    assert plain.dataset.src is src and plain.dataset.tgt is tgt  # the cached arrays, served as they are
    on = build_resegmentation(load_config("tiny", ["data.tokenizer=spm", "subword_sampling.alpha=0.2",
                                                    "subword_sampling.sides=src"]), data)
    src1, tgt1 = on(1)
    assert (on.cfg.alpha, on.seed) == (0.2, 42) and tgt1 is tgt and not same(src1, src)


def test_a_resegmentation_that_loses_rows_is_a_clear_error(subwords):
    from annotated_transformer.runtime.errors import DataError

    _, _, _, src, tgt = subwords
    broken = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=lambda epoch: (src[:-1], tgt[:-1]))
    with pytest.raises(DataError, match="must stay aligned"):
        broken.set_epoch(0)


# --------------------------------------------------------------------------- bidirectional training


def test_direction_sampling_reverses_a_fresh_share_of_pairs_in_the_first_epochs_only(subwords):
    _, _, _, src, tgt = subwords
    bi = DirectionSampling(lambda epoch: (src, tgt), epochs=2, rate=0.3, seed=3)
    masks = []
    for epoch in (0, 1):
        src_e, tgt_e = bi(epoch)
        flip = bi.reversed_rows(epoch, len(src))
        assert 0.25 < flip.mean() < 0.35 and bi.reversed_share == flip.mean()
        assert all(a is (t if f else s) and b is (s if f else t)
                   for a, b, s, t, f in zip(src_e, tgt_e, src, tgt, flip))  # a reversed pair is the same pair
        masks.append(flip)
    assert (masks[0] != masks[1]).mean() > 0.3  # drawn afresh each epoch
    assert np.array_equal(DirectionSampling(lambda e: (src, tgt), 2, 0.3, seed=3).reversed_rows(1, len(src)),
                          masks[1])  # a resumed run draws the same
    assert not np.array_equal(DirectionSampling(lambda e: (src, tgt), 2, 0.3, seed=4).reversed_rows(1, len(src)),
                              masks[1])
    later = bi(2)
    assert later[0] is src and later[1] is tgt and bi.reversed_share == 0.0  # then German -> English only


def test_the_loader_serves_reversed_pairs_on_the_plain_plan(subwords):
    _, _, _, src, tgt = subwords
    bi = DirectionSampling(lambda epoch: (src, tgt), epochs=1, rate=0.5, seed=3)
    plain = TrainLoader(src, tgt, batch_tokens=400, seed=5)
    both = TrainLoader(src, tgt, batch_tokens=400, seed=5, resegment=bi)
    assert len(both) == len(plain)
    both.set_epoch(0)
    flip, rows = bi.reversed_rows(0, len(src)), both.sampler.batches(0)
    batch = next(iter(both))
    for j, i in enumerate(rows[0]):
        want = tgt[i] if flip[i] else src[i]
        assert np.array_equal(batch.src[j, :len(want)].numpy(), want)
    assert flip[rows[0]].any() and not flip[rows[0]].all()
    assert [list(r) for r in rows] == [list(r) for r in plain.sampler.batches(0)]  # the plain plan
    want_tgt = [src[i] if flip[i] else tgt[i] for i in rows[0]]
    assert batch.ntokens == sum(len(t) - 1 for t in want_tgt)
    it = iter(both)
    next(it), next(it)
    state, expected = both.state_dict(), next(it)
    fresh = TrainLoader(src, tgt, batch_tokens=400, seed=5,
                        resegment=DirectionSampling(lambda epoch: (src, tgt), epochs=1, rate=0.5, seed=3))
    fresh.load_state_dict(state)  # a resumed run: the same reversed pairs at the same batch
    again = next(iter(fresh))
    assert again.src.equal(expected.src) and again.tgt.equal(expected.tgt)


@pytest.mark.slow
def test_bidirectional_off_is_the_cached_ids_and_on_composes_with_subword_sampling(subwords):
    text, src_text, tgt_text, src, tgt = subwords
    data = SimpleNamespace(text=text, splits={"train": SimpleNamespace(src_text=src_text, tgt_text=tgt_text,
                                                                      src=src, tgt=tgt)})
    assert build_resegmentation(load_config("tiny", ["data.tokenizer=spm", "bidirectional.rate=0.9"]), data) is None
    only = build_resegmentation(load_config("tiny", ["data.tokenizer=spm", "bidirectional.epochs=2",
                                                      "train.epochs=5"]), data)
    assert (only.epochs, only.rate, only.seed) == (2, 0.5, 42)
    assert only(2)[0] is src and not same(only(0)[0], src)
    both = build_resegmentation(load_config("tiny", ["data.tokenizer=spm", "bidirectional.epochs=1",
                                                      "train.epochs=5", "subword_sampling.alpha=0.2"]), data)
    sampled = both.base(0)
    flip = both.reversed_rows(0, len(src))
    src0 = both(0)[0]
    assert all(np.array_equal(a, sampled[1][i] if flip[i] else sampled[0][i]) for i, a in enumerate(src0))
    assert same(both(1)[0], both.base(1)[0]) and not same(both(1)[0], src)  # sampled, no longer reversed


# --------------------------------------------------------------------------- R-Drop


def tiny_model(dropout: float, seed: int = 0):
    torch.manual_seed(seed)
    return make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=dropout).train()


def padded_batch(seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (3, 9), generator=g)
    tgt = torch.randint(3, V, (3, 8), generator=g)
    src[0, 4:] = PAD
    tgt[:, 0] = BOS
    tgt[1, 5:] = PAD
    return Batch(src, tgt, pad=PAD)


def test_symmetric_kl_is_the_two_kl_divergences_over_the_kept_rows():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 11, generator=g), torch.randn(6, 11, generator=g)
    keep = torch.tensor([True, True, False, True, True, False])
    la, lb = a.log_softmax(-1)[keep], b.log_softmax(-1)[keep]
    want = F.kl_div(lb, la, log_target=True, reduction="sum") + F.kl_div(la, lb, log_target=True, reduction="sum")
    assert symmetric_kl(a, b, keep).item() == pytest.approx(want.item(), rel=1e-5)
    assert symmetric_kl(a, a, keep).item() == 0.0


def test_r_drop_without_dropout_is_the_plain_loss_and_gradient():
    b = padded_batch()
    grads = []
    for objective in (None, RDropObjective(alpha=5.0, pad=PAD)):
        model = tiny_model(dropout=0.0)
        loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
        if objective is None:
            logged, loss = loss_compute(model(b.src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, b.ntokens)
        else:
            logged, loss = objective(model, b, loss_compute, b.ntokens, 0)
            assert objective.last_kl.item() == pytest.approx(0.0, abs=1e-6)  # identical passes agree
        loss.backward()
        grads.append((logged, [p.grad.clone() for p in model.parameters()]))
    (plain_loss, plain_grads), (rdrop_loss, rdrop_grads) = grads
    assert rdrop_loss.item() == pytest.approx(plain_loss.item(), rel=1e-5)  # the mean of two equal passes
    assert all(torch.allclose(g, h, atol=1e-6) for g, h in zip(plain_grads, rdrop_grads))


def test_r_drop_adds_alpha_times_a_quarter_of_the_divergence_between_two_dropout_passes():
    b = padded_batch()
    model = tiny_model(dropout=0.3)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
    objective = RDropObjective(alpha=4.0, pad=PAD)
    torch.manual_seed(7)
    logged, loss = objective(model, b, loss_compute, 1.0, 0)
    kl = objective.last_kl * b.ntokens  # back to the sum over target tokens
    assert kl.item() > 0  # two dropout masks, two distributions
    assert loss.item() == pytest.approx(logged.item() + 4.0 * kl.item() / 4, rel=1e-5)
    torch.manual_seed(7)  # the same draws: the two halves of one doubled forward pass
    twice = [torch.cat([t, t]) for t in (b.src, b.tgt, b.src_mask, b.tgt_mask)]
    logits = model.generator.logits(model(*twice))  # (2B, T, V)
    y = torch.cat([b.tgt_y, b.tgt_y]).reshape(-1)
    ce = LabelSmoothing(V, PAD, 0.1)(logits.reshape(-1, V).log_softmax(-1), y) / 2
    assert logged.item() == pytest.approx(ce.item(), rel=1e-5)
    assert objective.figures()["rdrop_kl"] == pytest.approx(objective.last_kl.item())


def test_r_drop_off_is_the_plain_step():
    assert build_r_drop(0.0, PAD) is None
    objective = build_training(load_config("tiny"), V, V, PAD, torch.device("cpu"))[2]
    assert objective is None
    on = build_training(load_config("tiny", ["r_drop.alpha=1"]), V, V, PAD, torch.device("cpu"))[2]
    assert isinstance(on, RDropObjective) and on.compute_factor == 2.0


# --------------------------------------------------------------------------- token cutoff


def test_cut_tokens_replaces_only_ordinary_tokens_at_the_rate():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, V, (64, 40), generator=g)
    src[:, 0], src[:, 30] = BOS, EOS
    src[:, 31:] = PAD
    torch.manual_seed(1)
    cut, mask = cut_tokens(src, 0.3)
    changed = cut != src
    assert torch.equal(mask, changed)
    assert torch.equal(cut[changed], torch.full_like(cut[changed], UNK))  # a cut token becomes <unk>
    assert not changed[:, 0].any() and not changed[:, 30:].any()  # <s>, </s> and padding never
    share = changed[:, 1:30].float().mean().item()
    assert 0.25 < share < 0.35  # 1,856 draws at 0.3
    torch.manual_seed(1)
    assert torch.equal(cut_tokens(src, 0.3)[0], cut)  # PyTorch's generator: a resumed run draws the same
    assert torch.equal(cut_tokens(src, 0.0)[0], src)


def test_cutoff_is_the_plain_loss_on_the_cut_source():
    b = padded_batch()
    model = tiny_model(dropout=0.0)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
    objective = CutoffObjective(rate=0.4)
    torch.manual_seed(3)
    logged, loss = objective(model, b, loss_compute, b.ntokens, 0)
    torch.manual_seed(3)
    src, cut = cut_tokens(b.src, 0.4)
    assert not torch.equal(src, b.src)
    want_logged, want = loss_compute(model(src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, b.ntokens)
    assert (logged.item(), loss.item()) == (pytest.approx(want_logged.item()), pytest.approx(want.item()))
    plain = loss_compute(model(b.src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, b.ntokens)[0]
    assert plain.item() != pytest.approx(logged.item())  # the cut tokens change the loss
    assert objective.figures()["cutoff_share"] == pytest.approx(cut.sum().item() / (b.src != PAD).sum().item())


def test_cutoff_off_is_the_plain_step():
    assert build_cutoff(0.0) is None
    assert build_training(load_config("tiny"), V, V, PAD, torch.device("cpu"))[2] is None
    on = build_training(load_config("tiny", ["cutoff.rate=0.1"]), V, V, PAD, torch.device("cpu"))[2]
    assert isinstance(on, CutoffObjective) and on.rate == 0.1 and on.compute_factor == 1.0


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides, message", [
    (["subword_sampling.alpha=0.1"], "subword_sampling needs SentencePiece subwords: set data.tokenizer=spm"),
    (["data.tokenizer=spm", "subword_sampling.alpha=-1"], "subword_sampling.alpha must not be negative"),
    (["data.tokenizer=spm", "subword_sampling.alpha=0.1", "subword_sampling.nbest=1"],
     "subword_sampling.nbest must be -1"),
    (["data.tokenizer=spm", "subword_sampling.sides=neither"], "subword_sampling.sides must be one of"),
    (["r_drop.alpha=-0.5"], "r_drop.alpha must not be negative"),
    (["r_drop.alpha=5", "scheduled_sampling.rate=0.2"],
     "r_drop and scheduled_sampling are on together"),
    (["cutoff.rate=1"], r"cutoff.rate must be in \[0, 1\)"),
    (["cutoff.rate=-0.1"], r"cutoff.rate must be in \[0, 1\)"),
    (["cutoff.rate=0.1", "r_drop.alpha=5"], "r_drop and cutoff are on together"),
    (["cutoff.rate=0.1", "guided_attention.weight=0.5"], "cutoff and guided_attention are on together"),
    (["cutoff.rate=0.1", "guided_attention.weight=0.5", "scheduled_sampling.rate=0.2"],
     "cutoff and scheduled_sampling with guided_attention are on together"),
    (["cutoff.rate=0.1", "data.dataset=copy"], "cutoff replaces source words by <unk>, which the copy task has not"),
    (["bidirectional.epochs=3", "train.epochs=5"],
     "bidirectional training reads each pair both ways, which needs one vocabulary"),
    (["data.tokenizer=spm", "bidirectional.epochs=-1"], r"bidirectional.epochs must be >= 0"),
    (["data.tokenizer=spm", "bidirectional.epochs=1", "train.epochs=3", "bidirectional.rate=1.5"],
     r"bidirectional.rate must be in \(0, 1\]"),
    (["data.tokenizer=spm", "bidirectional.epochs=3", "train.epochs=3"],
     r"bidirectional.epochs \(3\) must be below train.epochs \(3\)"),
])
def test_bad_regulariser_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", overrides).validate()


# --------------------------------------------------------------------------- the user's command


@pytest.mark.slow
def test_the_data_and_objective_switches_train_together_from_the_command_line(tmp_path, train_command, multi30k_dir,
                                                                              data_cache_dir):
    import json

    out = tmp_path / "run"
    code, out_text, err = train_command(
        "--config", "tiny.yaml", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
        "data.tokenizer=spm", "data.spm_vocab_size=1000", "subword_sampling.alpha=0.1", "r_drop.alpha=1",
        "bidirectional.epochs=1", "train.epochs=2",
        "train.max_steps=60", "train.log_every=20", f"train.out_dir={out}", "train.progress=false",
        "train.final_eval=false")
    assert code == 0, err[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 3 and all(r["rdrop_kl"] > 0 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]  # it learns through both switches
    epoch = next(r for r in records if r["kind"] == "epoch")
    saved = (out / "config.yaml").read_text()
    assert epoch["train_flops"] > 0 and "subword_sampling:\n  alpha: 0.1\n" in saved
    assert "bidirectional:\n  epochs: 1\n" in saved
    said = re.search(r"epoch 1: (\d+)% of the training pairs served reversed", out_text + err)
    assert said and 40 <= int(said.group(1)) <= 60  # rate 0.5, said where the user reads the log


@pytest.mark.slow
def test_cutoff_trains_from_the_command_line(tmp_path, train_command, multi30k_dir, data_cache_dir):
    import json

    out = tmp_path / "run"
    code, _, err = train_command(
        "--config", "tiny.yaml", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}", "cutoff.rate=0.2",
        "train.max_steps=40", "train.log_every=20", f"train.out_dir={out}", "train.progress=false",
        "train.final_eval=false")
    assert code == 0, err[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2 and all(0.1 < r["cutoff_share"] < 0.3 for r in train)
    assert "cutoff:\n  rate: 0.2\n" in (out / "config.yaml").read_text()


@pytest.mark.parametrize("overrides, served", [(["subword_sampling.alpha=0.1"], True),
                                               (["bidirectional.epochs=1", "train.epochs=2"], False),
                                               ([], False)])
def test_batches_follow_the_served_lengths_only_under_a_resegmentation_that_changes_them(monkeypatch, overrides,
                                                                                       served):
    """Subword sampling registers changes_lengths; reversed pairs keep each pair's width, so the cached plan holds."""
    from annotated_transformer.harness import tasks
    from annotated_transformer.harness.distributed import DistInfo

    asked = {}

    class Data:
        def train_loader(self, *args, **kwargs):
            asked.update(kwargs)

    monkeypatch.setattr(tasks, "build_resegmentation", lambda cfg, data: None)
    cfg = load_config("tiny", ["data.tokenizer=spm", *overrides])
    tasks.TranslationTask(cfg, DistInfo(), Data()).train_loader()
    assert asked["plan_on_served"] is served
