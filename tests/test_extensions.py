"""The Transformer's extensions: local attention, scheduled sampling, guided attention (exact when off)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from annotated_transformer.cli import run
from annotated_transformer.config import load_config
from annotated_transformer.data.batch import Batch
from annotated_transformer.decode.beam_search import beam_search
from annotated_transformer.decode.incremental import greedy_search
from annotated_transformer.decoding import greedy_decode
from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.extensions.guided_attention import (
    GuidedAttentionConfig,
    GuidedAttentionObjective,
    guide_weights,
    guided_attention_penalty,
)
from annotated_transformer.extensions.scheduled_sampling import (
    ScheduledSamplingConfig,
    ScheduledSamplingObjective,
    mix_inputs,
    replace_probability,
)
from annotated_transformer.extensions.guided_attention import ProbsForLoss
from annotated_transformer.extensions.local_attention import local_mask, with_local_attention
from annotated_transformer.extensions.token_merging import (
    SeenByAttention,
    TokenMerger,
    TokenMergingModel,
    merged_groups,
    merged_groups_by_layer,
    with_token_merging,
)
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute
from annotated_transformer.model import EncoderDecoder, attention, make_model
from annotated_transformer.visualization import keep_attention

PAD, BOS, EOS, V = 2, 0, 1, 23


def kept(**tensors) -> SimpleNamespace:
    """What a merging layer's attention hook keeps for the merger: .keys (merging) or .probs (pruning)."""
    return SimpleNamespace(**tensors)


def objective(model, pad: int = PAD, **switches):
    """The objective of `ss_*` and `guide_*` keywords (the two config sections' fields), as the builder makes it:
    guided attention wraps scheduled sampling when both are given."""
    ss = {k[3:]: v for k, v in switches.items() if k.startswith("ss_")}
    ga = {k[6:]: v for k, v in switches.items() if k.startswith("guide_")}
    inner = ScheduledSamplingObjective(ScheduledSamplingConfig(**ss), pad) if ss else None
    return GuidedAttentionObjective(GuidedAttentionConfig(**ga), model, pad, inner) if ga else inner


def tiny(window: int = 0, N: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    return with_local_attention(make_model(V, V, N=N, d_model=32, d_ff=64, h=4, dropout=0.0), window).eval()


def padded_batch(seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (3, 9), generator=g)
    tgt = torch.randint(3, V, (3, 8), generator=g)
    src[0, 4:] = PAD
    src[2, 7:] = PAD
    tgt[:, 0] = BOS
    tgt[1, 5:] = PAD
    return Batch(src, tgt, pad=PAD)


# --------------------------------------------------------------------------- local attention


def test_local_mask_is_a_band_that_always_keeps_the_query():
    band = local_mask(5, 5, 1)[0]
    assert band.tolist()[2] == [False, True, True, True, False]
    causal = local_mask(2, 6, 2, start=4, causal=True)[0]  # queries at positions 4 and 5 of a cache of 6
    assert causal.tolist() == [[False, False, True, True, True, False], [False, False, False, True, True, True]]
    assert local_mask(7, 7, 0)[0].equal(torch.eye(7, dtype=torch.bool))


def test_a_window_as_long_as_the_sentence_is_full_attention():
    b = padded_batch()
    full, wide = tiny(0), tiny(window=9)
    out_full = full(b.src, b.tgt, b.src_mask, b.tgt_mask)
    out_wide = wide(b.src, b.tgt, b.src_mask, b.tgt_mask)
    real = b.tgt != PAD  # padding queries may also see themselves in the windowed model; nothing reads them
    assert torch.allclose(out_full[real], out_wide[real], atol=1e-6, rtol=0)


def test_a_small_window_limits_what_a_position_sees_and_padding_gives_no_nan():
    model = tiny(window=1, N=1)
    src = torch.randint(3, V, (1, 9), generator=torch.Generator().manual_seed(3))
    src[0, 6:] = PAD  # three padding queries: their windows hold only padding except themselves
    changed = src.clone()
    changed[0, 4] = (src[0, 4] + 1 - 3) % (V - 3) + 3
    mask = (src != PAD).unsqueeze(1)
    a, b = model.encode(src, mask), model.encode(changed, mask)
    assert a.isfinite().all()
    with keep_attention(model):
        model.encode(src, mask)
    p = model.encoder.layers[0].self_attn.attn[0, 0]  # (S, S)
    assert p[8].equal(torch.eye(9)[8]) and p[2, 4:].eq(0).all()  # a padding query keeps itself; the band holds
    moved = (a - b).abs().amax(-1)[0]  # (S,)
    assert moved[[3, 4, 5]].gt(1e-4).all() and moved[[0, 1, 2]].eq(0).all()  # one layer, window 1: +/-1 only
    unwindowed = tiny(window=0, N=1)
    c, d = unwindowed.encode(src, mask), unwindowed.encode(changed, mask)
    assert (c - d).abs().amax(-1)[0, :3].gt(1e-4).all()  # full attention: everything moves


def test_decoding_with_a_window_agrees_between_cache_and_full_prefix():
    model = tiny(window=2)
    b = padded_batch()
    cached = greedy_search(model, b.src, b.src_mask, 12, BOS, EOS, PAD)
    naive = greedy_decode(model, b.src, b.src_mask, 12, BOS, EOS, PAD)
    assert cached.equal(naive)
    beam = beam_search(model, b.src, b.src_mask, 12, BOS, EOS, beam_size=1, pad_symbol=PAD)
    assert beam[:, :cached.size(1)].equal(cached)
    wider = tiny(window=0)
    assert not greedy_search(wider, b.src, b.src_mask, 12, BOS, EOS, PAD).equal(cached)


# --------------------------------------------------------------------------- scheduled sampling


@pytest.mark.parametrize("schedule", ["constant", "linear", "exponential", "inverse_sigmoid"])
def test_the_replacement_probability_follows_its_schedule(schedule):
    p = [replace_probability(s, 0.4, schedule, start=100, steps=50) for s in range(0, 1000, 10)]
    assert all(x == 0.0 for x in p[:10])  # before the start: teacher forcing
    assert all(b >= a for a, b in zip(p, p[1:])) and 0.0 <= max(p) <= 0.4  # rises to the rate, never above
    assert p[-1] == pytest.approx(0.4, abs=0.01)
    expected = {"constant": 0.4, "linear": 0.2, "exponential": 0.4 * (1 - math.exp(-0.5)),
                "inverse_sigmoid": 0.4 * (1 - 50 / (50 + math.exp(0.5)))}[schedule]
    assert replace_probability(125, 0.4, schedule, 100, 50) == pytest.approx(expected)


def test_mixing_shifts_the_guess_for_token_i_to_input_i_plus_1_and_keeps_bos_and_padding():
    b = padded_batch()
    guess = (b.tgt_y + 1 - 3) % (V - 3) + 3  # differs from every gold token, never padding
    mixed = mix_inputs(b.tgt, b.tgt_y, guess, 1.0, PAD)
    assert mixed[:, 0].eq(BOS).all()
    real_next = b.tgt[:, 1:] != PAD
    assert mixed[:, 1:][real_next].equal(guess[:, :-1][real_next])  # the model's guess, not its own target
    assert mixed[:, 1:][~real_next].eq(PAD).all()
    assert mix_inputs(b.tgt, b.tgt_y, guess, 0.0, PAD).equal(b.tgt)
    assert mix_inputs(b.tgt, b.tgt_y, torch.full_like(guess, PAD), 1.0, PAD).equal(b.tgt)  # padding never fed


def test_the_mixing_rate_is_p():
    torch.manual_seed(0)
    tgt = torch.randint(3, V, (200, 30))
    tgt[:, 0] = BOS
    b = Batch(tgt, tgt, pad=PAD)
    guess = (b.tgt_y + 1 - 3) % (V - 3) + 3
    mixed = mix_inputs(b.tgt, b.tgt_y, guess, 0.3, PAD)
    rate = (mixed[:, 1:] != b.tgt[:, 1:]).float().mean().item()
    assert rate == pytest.approx(0.3, abs=0.02)  # 5,800 draws: sd about 0.006


def _loss_and_grads(model, b, objective, step):
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
    model.zero_grad()
    if objective is None:
        loss = loss_compute(model(b.src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, b.ntokens)[1]
    else:
        loss = objective(model, b, loss_compute, b.ntokens, step)[1]
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_scheduled_sampling_at_p_0_is_the_teacher_forced_loss_and_gradient():
    model, b = tiny().train(), padded_batch()
    plain = _loss_and_grads(model, b, None, 0)
    objective_ = objective(model, ss_rate=0.5, ss_start=10)
    before_start = _loss_and_grads(model, b, objective_, 5)
    assert objective_.last_p == 0.0 and plain[0].equal(before_start[0])
    assert all(g.equal(h) for g, h in zip(plain[1], before_start[1]))
    mixing = _loss_and_grads(model, b, objective_, 10_000)
    assert objective_.last_p == 0.5 and not mixing[0].equal(plain[0])  # the second pass saw other inputs
    assert load_config("copy.yaml").extensions_on("objective") == []  # both switches off: the plain step


def test_scheduled_sampling_feeds_the_first_pass_argmax(monkeypatch):
    model, b = tiny().train(), padded_batch()
    seen = []
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda src, tgt, *a: seen.append(tgt.clone()) or original(src, tgt, *a))
    sampling = objective(model, ss_rate=1.0, ss_schedule="constant")
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
    sampling(model, b, loss_compute, b.ntokens, 0)
    with torch.no_grad():
        guess = model.generator.logits(original(b.src, b.tgt, b.src_mask, b.tgt_mask)).argmax(-1)
    assert seen[0].equal(b.tgt)  # the first pass is teacher-forced
    expected = mix_inputs(b.tgt, b.tgt_y, guess, 1.0, PAD)
    assert seen[1].equal(expected)


# --------------------------------------------------------------------------- guided attention


def test_a_diagonal_square_map_costs_nothing_and_padding_costs_nothing():
    n = torch.tensor([6])
    w = guide_weights(n, n, 6, 6, 0.2)  # (1, 6, 6)
    diagonal = torch.eye(6).view(1, 1, 6, 6)
    assert guided_attention_penalty(diagonal, w).item() == 0.0
    assert guided_attention_penalty(torch.eye(6).flip(1).view(1, 1, 6, 6), w).item() > 3.0  # anti-diagonal
    w = guide_weights(torch.tensor([4]), torch.tensor([3]), 7, 5, 0.2)
    assert w[0, 3:].eq(0).all() and w[0, :, 4:].eq(0).all() and w[0, :3, :4].gt(0).any()


def test_the_penalty_trains_the_guided_heads_only_and_is_off_at_weight_0():
    model, b = tiny().train(), padded_batch()
    plain = _loss_and_grads(model, b, None, 0)
    guide = objective(model, guide_weight=1.0, guide_layers=[1], guide_heads=[0, 2], guide_decay_steps=100)
    attn = model.decoder.layers
    hook = attn[1].src_attn.hooks[0]
    assert isinstance(hook, ProbsForLoss) and attn[0].src_attn.hooks == []  # the rest ask for no probabilities
    assert hook.needs_probs(attn[1].src_attn)  # in training: probabilities with their gradient, under any kernel
    guided = _loss_and_grads(model, b, guide, 0)
    assert guide.figures()["guide_penalty"] > 0 and guided[0] > plain[0]
    assert not guided[1][0].equal(plain[1][0])
    decayed = _loss_and_grads(model, b, guide, 100)  # the weight has fallen to 0
    assert torch.allclose(decayed[0], plain[0], atol=1e-6)  # weight 0: the plain loss, to rounding
    assert load_config("copy.yaml", ["guided_attention.weight=0"]).extensions_on("objective") == []  # off at 0
    model.eval()
    model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    assert hook.probs is None and not hook.needs_probs(attn[1].src_attn)  # evaluation and decoding ask for none


def test_the_penalty_reads_probabilities_before_dropout():
    torch.manual_seed(0)
    model = make_model(V, V, N=1, d_model=32, d_ff=64, h=4, dropout=0.5).train()
    b = padded_batch()
    guide = objective(model, guide_weight=1.0)
    model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    probs = guide.guided[0].probs  # (B, h, T, S)
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5)  # rows of a softmax, not dropped


def test_guided_attention_adds_its_penalty_to_the_scheduled_sampling_pass():
    model, b = tiny().train(), padded_batch()
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, 0.1))
    both = objective(model, ss_rate=1.0, ss_schedule="constant", guide_weight=1.0)
    torch.manual_seed(3)
    mixed = both.inner(model, b, loss_compute, b.ntokens, 0)[1]  # scheduled sampling's loss alone
    torch.manual_seed(3)  # the same replacements again
    loss = both(model, b, loss_compute, b.ntokens, 0)[1]
    target_tokens = (b.tgt != PAD).sum()
    assert loss > mixed and torch.allclose(loss - mixed, both.last_penalty * target_tokens / b.ntokens)
    assert set(both.figures()) == {"ss_p", "guide_penalty"} and both.compute_factor == 4 / 3


# --------------------------------------------------------------------------- token merging


def test_merging_averages_the_most_similar_pair_by_size_and_keeps_padding_out():
    x = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [7.0, 1.0], [1e6, 1e6], [1e6, 1e6]]])  # (1, 6, 2)
    keys = torch.tensor([[[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0], [1.0, 0, 0]]])
    mask = torch.tensor([[[True] * 4 + [False] * 2]])  # (1, 1, 6): two padding tokens with token 0's key
    merger = TokenMerger(mask, ratio=0.25)
    out = merger(x, kept(keys=keys.unsqueeze(1)))  # keys (B, h=1, S, d_k)
    assert out.shape == (1, 3, 2)  # one merge (0.25 x 4), and the padding left the sequence
    assert out[0].tolist() == [[2.0, 1.0], [5.0, 5.0], [7.0, 1.0]]  # tokens 0 and 1 averaged, the rest as they were
    assert merger.size.tolist() == [[2.0, 1.0, 1.0]]
    assert merger.slot.tolist() == [[0, 0, 1, 2, -1, -1]]  # where each source token went; padding nowhere
    assert torch.allclose(merger.mask, torch.tensor([[[math.log(2), 0.0, 0.0]]]))  # proportional attention


def test_merged_sizes_always_sum_to_the_real_length():
    torch.manual_seed(0)
    lengths = torch.tensor([9, 4, 1, 7])
    mask = (torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1)  # (4, 1, 9)
    merger = TokenMerger(mask, ratio=0.5)
    x = torch.randn(4, 9, 8)
    for _ in range(3):  # three merging layers in a row
        n_before = (merger.size > 0).sum(1)
        x = merger(x, kept(keys=torch.randn(4, 2, x.size(1), 4)))
        assert merger.size.sum(1).tolist() == lengths.float().tolist()
        merged = torch.minimum(n_before // 2, (0.5 * n_before).floor().long())
        assert ((merger.size > 0).sum(1) == n_before - merged).all()
    assert x.size(1) == int((merger.size > 0).sum(1).max()) < 9
    assert ((merger.slot >= 0).sum(1) == lengths).all()  # every real token has a place, padding has none


def test_proportional_attention_to_a_merged_token_equals_attention_to_its_parts():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    k3, v3 = torch.cat([k[:, :1], k[:, :1], k[:, 1:]], 1), torch.cat([v[:, :1], v[:, :1], v[:, 1:]], 1)  # token 0 twice
    separate, _ = attention(q, k3, v3)
    merged, _ = attention(q, k, v, mask=torch.tensor([[[math.log(2.0), 0.0]]]))
    assert torch.allclose(separate, merged, atol=1e-6)
    plain, _ = attention(q, k, v)
    assert not torch.allclose(separate, plain, atol=1e-3)


def test_merging_ratio_0_is_exact_and_merging_shortens_the_memory():
    b = padded_batch()
    model = tiny()
    memory, mask = model.encode_memory(b.src, b.src_mask)
    assert memory.equal(model.encode(b.src, b.src_mask)) and mask is b.src_mask
    assert with_token_merging(model, 0.0) is model  # ratio 0: the model itself
    merging = with_token_merging(model, 0.5)
    assert isinstance(merging, TokenMergingModel) and merging.layers == [0, 1]
    assert all(isinstance(layer.self_attn.hooks[0], SeenByAttention) for layer in model.encoder.layers)
    assert merging.state_dict().keys() == model.state_dict().keys()  # the same weights, checkpoints alike
    merged, merged_mask = merging.encode_memory(b.src, b.src_mask)
    assert merged.size(1) < b.src.size(1) and merged_mask.dtype == torch.float32
    plain = with_token_merging(merging, 0.0)  # merging off again
    assert type(plain) is EncoderDecoder and plain.encode_memory(b.src, b.src_mask)[0].equal(memory)
    assert not any(layer.self_attn.hooks for layer in model.encoder.layers)


@pytest.mark.parametrize("proportional", [True, False])
def test_decoding_with_a_merged_memory_agrees_between_cache_and_full_prefix(proportional):
    b = padded_batch()
    model = with_token_merging(tiny(), 0.4, layers=(0,), proportional=proportional)
    cached = greedy_search(model, b.src, b.src_mask, 12, BOS, EOS, PAD)
    assert cached.equal(greedy_decode(model, b.src, b.src_mask, 12, BOS, EOS, PAD))
    beam1 = beam_search(model, b.src, b.src_mask, 12, BOS, EOS, beam_size=1, pad_symbol=PAD)
    assert beam1[:, :cached.size(1)].equal(cached)
    beam4 = beam_search(model, b.src, b.src_mask, 12, BOS, EOS, beam_size=4, pad_symbol=PAD)
    assert beam4.size(0) == 3 and beam4[:, 0].eq(BOS).all()
    # one sentence alone decodes as it does inside the batch: nothing leaks between rows through the merging
    alone = greedy_search(model, b.src[1:2], b.src_mask[1:2], 12, BOS, EOS, PAD)
    assert alone[0].equal(cached[1, :alone.size(1)])


def test_merged_groups_cover_every_source_position_once():
    model = tiny()
    groups = merged_groups(model, [0, 5, 6, 7, 8, 9, 10, 11, 1], ratio=0.5)
    assert sorted(p for g in groups for p in g) == list(range(9)) and len(groups) < 9
    by_layer = merged_groups_by_layer(model, [0, 5, 6, 7, 8, 9, 10, 11, 1], ratio=0.5)
    assert len(by_layer) == 2 and by_layer[-1] == groups and len(by_layer[0]) > len(groups)  # fewer after each layer
    assert not any(layer.self_attn.hooks for layer in model.encoder.layers)  # left as it was


@pytest.mark.parametrize("mode", ["merge", "prune"])
def test_tied_tokens_leave_alike_whether_a_sentence_is_alone_or_padded_in_a_batch(mode):
    S = 40  # every token alike: every pair's similarity (every token's attention) ties
    leaving = []
    for length in (S, 2 * S, 3 * S):  # the sentence alone, then padded beside longer ones
        mask = (torch.arange(length) < S).view(1, 1, length)
        keys = torch.cat([torch.ones(1, 2, S, 4), torch.randn(1, 2, length - S, 4)], 2)  # (1, h, L, d_k)
        probs = torch.full((1, 2, length, length), 1.0 / S)  # (B, h, L, L)
        merger = TokenMerger(mask, ratio=0.25, mode=mode)
        merger(torch.randn(1, length, 2), kept(keys=keys, probs=probs))
        leaving.append(merger.slot[0, :S].tolist())
    assert leaving[0] == leaving[1] == leaving[2]
    assert len(set(leaving[0]) - {-1}) == S - S // 4  # a quarter left (merged or pruned): the ties were decided


# --------------------------------------------------------------------------- token pruning


def test_pruning_drops_the_least_attended_tokens_and_keeps_padding_out():
    x = torch.arange(12.0).view(1, 6, 2)  # (1, 6, 2)
    probs = torch.zeros(1, 2, 6, 6)  # (B, h, S, S): what each query gives each key
    probs[:, :, :, 0] = 0.4
    probs[:, :, :, 1] = 0.3
    probs[:, 0, :, 2], probs[:, 1, :, 2] = 0.3, 0.1  # token 2 draws 0.2 on average over the heads
    probs[:, 0, :, 3], probs[:, 1, :, 3] = 0.0, 0.2  # token 3 draws 0.1: the least
    probs[:, :, 4:, 3] = 9.0  # queries at the padding positions do not count
    mask = torch.tensor([[[True] * 4 + [False] * 2]])  # (1, 1, 6)
    merger = TokenMerger(mask, ratio=0.25, mode="prune")
    out = merger(x, kept(probs=probs))
    assert out[0].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]  # token 3 and the padding left, the rest unchanged
    assert merger.size.tolist() == [[1.0, 1.0, 1.0]]
    assert merger.slot.tolist() == [[0, 1, 2, -1, -1, -1]]
    merger = TokenMerger(mask, ratio=0.5, mode="prune")
    assert merger(x, kept(probs=probs))[0].tolist() == [[0.0, 1.0], [2.0, 3.0]]  # then token 2


def test_pruning_in_the_model_shortens_the_memory_and_decodes_alike_cached_and_not():
    base, b = tiny(), padded_batch()
    model = with_token_merging(base, prune_ratio=0.4)
    assert all(layer.self_attn.hooks[0].needs_probs(layer.self_attn) for layer in model.encoder.layers)
    memory, mask = model.encode_memory(b.src, b.src_mask)
    real = b.src_mask[:, 0].sum(1)  # (B,)
    left = (mask > float("-inf")).sum((1, 2)) if mask.dtype != torch.bool else mask.sum((1, 2))
    assert (left < real).all() and memory.size(1) < b.src.size(1)
    cached = greedy_search(model, b.src, b.src_mask, 12, BOS, EOS, PAD)
    assert cached.equal(greedy_decode(model, b.src, b.src_mask, 12, BOS, EOS, PAD))
    beam1 = beam_search(model, b.src, b.src_mask, 12, BOS, EOS, beam_size=1, pad_symbol=PAD)
    assert beam1[:, :cached.size(1)].equal(cached)
    groups = merged_groups(model, [0, 5, 6, 7, 8, 9, 10, 11, 1], ratio=0.5, mode="prune")
    assert all(len(g) == 1 for g in groups) and 0 < len(groups) < 9  # survivors alone, the pruned in no group
    with_token_merging(model, 0.0)
    assert not any(layer.self_attn.hooks for layer in base.encoder.layers)  # no hook left


@pytest.mark.parametrize("prune", [False, True])
def test_a_model_trains_through_the_merging(prune):
    b = padded_batch()
    model = with_token_merging(tiny(), *((0.0, 0.5) if prune else (0.5, 0.0))).train()
    loss = _loss_and_grads(model, b, None, 0)
    assert loss[0].isfinite() and model.src_embed[0].lut.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- the user's command


@pytest.mark.slow
def test_the_switches_train_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--config", "copy.yaml", f"train.out_dir={out}", "train.epochs=3", "train.log_every=10",
            "scheduled_sampling.rate=0.25", "scheduled_sampling.schedule=constant", "scheduled_sampling.start=20",
            "guided_attention.weight=0.5", "guided_attention.heads=[0]", "local_attention.window=2",
            "train.progress=false"]
    with pytest.raises(SystemExit) as done:
        run("train", argv, "train.py")  # what scripts/train.py runs, in this process
    assert done.value.code == 0, capsys.readouterr().err[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    # logged after 10, 20, 30 steps: the step counted from 0 as 20 (the 21st) is the first to mix
    assert [r["ss_p"] for r in train[:3]] == [0.0, 0.0, 0.25]
    assert all(r["guide_penalty"] > 0 for r in train)
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"] < 2.0  # it learns (the start is about ln 11 = 2.4)
    assert "local_attention:\n  window: 2\n" in (out / "config.yaml").read_text()


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("override, message", [
    ("local_attention.window=-1", "local_attention.window must be 0"),
    ("scheduled_sampling.rate=1.5", "scheduled_sampling.rate must be in"),
    ("scheduled_sampling.steps=0", "scheduled_sampling.steps must be at least 1"),
    ("guided_attention.sigma=0", "guided_attention.sigma must be positive"),
    ("guided_attention.layers=[5]", r"guided_attention.layers \[5\] names a layer"),
    ("guided_attention.heads=[4]", r"guided_attention.heads \[4\] names a head"),
    ("scheduled_sampling.schedule=cubic", "scheduled_sampling.schedule must be one of"),
    ("token_merging.merge_ratio=0.6", r"token_merging.merge_ratio must be in \[0, 0.5\]"),
    ("token_merging.prune_ratio=-0.1", r"token_merging.prune_ratio must be in \[0, 0.5\]"),
    ("token_merging.layers=[2]", r"token_merging.layers \[2\] names a layer"),
    ("model.local_window=-1", "local_attention.window must be 0"),  # the old names still read, under the new
    ("objective.guide_heads=[4]", r"guided_attention.heads \[4\] names a head"),
])
def test_bad_extension_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("copy.yaml", [override, "model.h=4", "model.N=2"]).validate()
    with pytest.raises(ConfigError, match="local_attention.window is on with token merging or pruning"):
        load_config("copy.yaml", ["token_merging.prune_ratio=0.2", "local_attention.window=2"])
    with pytest.raises(ConfigError, match="token_merging.merge_ratio and token_merging.prune_ratio are both on"):
        load_config("copy.yaml", ["token_merging.merge_ratio=0.2", "token_merging.prune_ratio=0.2"])


# --------------------------------------------------------------------------- the cost benchmark


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_the_extension_benchmark_times_every_arm_against_the_first(tiny_config):
    from annotated_transformer.lab.extension_benchmark import measure_extensions

    arms = {"plain": (), "window 1": ("local_attention.window=1",), "guided": ("guided_attention.weight=1.0",),
            "pruning": ("token_merging.prune_ratio=0.25",)}
    result = measure_extensions(tiny_config(), arms, steps=1, rounds=1, sentences=4, length=5, log=lambda _: None)
    assert list(result["arms"]) == list(arms) and result["arms"]["plain"]["train_ratio"] == 1.0
    plain = result["arms"]["plain"]
    for row in result["arms"].values():  # each arm against the first
        assert row["train_tokens_per_s"] > 0 and row["decode_sentences_per_s"] > 0
        assert row["train_ratio"] == pytest.approx(row["train_tokens_per_s"] / plain["train_tokens_per_s"])
        assert row["decode_ratio"] == pytest.approx(row["decode_sentences_per_s"] / plain["decode_sentences_per_s"])
    assert result["arms"]["window 1"]["overrides"] == ["local_attention.window=1"]
    copy_cfg = load_config("copy.yaml")
    with pytest.raises(ConfigError, match="data.dataset=copy"):
        measure_extensions(copy_cfg, arms)


def test_the_benchmark_arms_can_be_chosen_and_plain_always_comes_first():
    from annotated_transformer.lab.extension_benchmark import ARMS, select_arms

    assert select_arms(None) == ARMS
    assert list(select_arms(["token pruning r=0.25"])) == ["plain", "token pruning r=0.25"]
    assert select_arms(["token pruning r=0.25"])["token pruning r=0.25"] == ("token_merging.prune_ratio=0.25",)
    with pytest.raises(ConfigError, match="--arms: unknown \\['pruning'\\]"):
        select_arms(["pruning"])
