"""Beam search: greedy at beam 1, exact against a plain beam search and against exhaustive search, batched.

Scores are recomputed here by teacher-forcing a sequence through the model without the cache,
so they check the search, not its own bookkeeping.
"""

import itertools
import math

import pytest
import torch

from annotated_transformer import greedy_decode, make_model
from annotated_transformer.decode.beam_search import (TOP_BLOCK, beam_search, beam_search_n_best, length_penalty,
                                                       top_indices)
from annotated_transformer.decode import incremental
from annotated_transformer.decode.inference import decode_batch, decode_n_best
from annotated_transformer.model import subsequent_mask

BOS, EOS, PAD = 0, 1, 2
FILL = -1  # output filling: not a vocabulary id, so a generated <pad> (random models emit any id) stays visible
SEEDS = (0, 3, 7, 11)  # random models whose greedy outputs end at </s> at varied lengths, or hit the limit


def random_model(seed: int, V: int = 15, eos_bias: float = 1.0):
    """A tiny random model in eval mode; `eos_bias` makes </s> likely enough to end sentences at varied lengths."""
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] += eos_bias
    return model


def random_sources(seed: int, B: int, V: int = 15):
    """B sources <s> w.. </s> of mixed lengths, padded with PAD; (src, src_mask, lengths)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (B,), generator=g)
    src = torch.full((B, int(lengths.max())), PAD)
    for i, L in enumerate(lengths.tolist()):
        src[i, :L] = torch.cat([torch.tensor([BOS]), torch.randint(3, V, (L - 2,), generator=g), torch.tensor([EOS])])
    return src, (src != PAD).unsqueeze(-2), lengths


@torch.no_grad()
def log_prob_sums(model, src_row, mask_row, hyps: list[list[int]]) -> list[float]:
    """Sum of log p of each hypothesis' generated tokens (start symbol excluded), by teacher forcing."""
    n, T = len(hyps), max(len(h) for h in hyps)
    tgt = torch.full((n, T + 1), PAD)
    tgt[:, 0] = BOS
    for i, h in enumerate(hyps):
        tgt[i, 1:len(h) + 1] = torch.tensor(h)
    memory = model.encode(src_row.expand(n, -1), mask_row.expand(n, -1, -1))  # (n, S, d)
    x = model.decode(memory, mask_row.expand(n, -1, -1), tgt[:, :-1], subsequent_mask(T))  # (n, T, d)
    logp = model.generator(x).double()  # (n, T, V)
    picked = logp.gather(2, tgt[:, 1:].unsqueeze(2)).squeeze(2)  # (n, T)
    return [float(picked[i, :len(h)].sum()) for i, h in enumerate(hyps)]


def final_score(total: float, length: int, alpha: float) -> float:
    """Wu et al.'s length-normalised score, written out independently of `length_penalty`."""
    return total / ((5 + length) / 6) ** alpha


def generated(row: list[int]) -> list[int]:
    """The generated tokens of an output row: after <s>, up to and including </s>, no filling."""
    row = row[1:]
    return row[: row.index(EOS) + 1] if EOS in row else [t for t in row if t != FILL]


def plain_beam(model, src_row, mask_row, limit: int, k: int, alpha: float) -> tuple[list[int], float]:
    """The same search written plainly: one sentence, recompute everything, no early stop."""
    finished = plain_finished(model, src_row, mask_row, limit, k, alpha)
    score, hyp = max(finished, key=lambda f: f[0])  # max() keeps the first of equals, as beam_search does
    return hyp, score


@torch.no_grad()
def plain_finished(model, src_row, mask_row, limit: int, k: int, alpha: float) -> list[tuple[float, list[int]]]:
    """Every hypothesis `plain_beam`'s search finishes, (final score, generated tokens), in the order it finishes."""
    memory = model.encode(src_row, mask_row)
    live: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    budget = k
    for t in range(1, limit):
        ys = torch.tensor([[BOS] + h for _, h in live])  # (n, t)
        x = model.decode(memory.expand(len(live), -1, -1), mask_row.expand(len(live), -1, -1), ys,
                         subsequent_mask(t))
        logp = model.generator(x[:, -1]).double()  # (n, V)
        cands = sorted(((s + float(logp[i, v]), h + [v]) for i, (s, h) in enumerate(live)
                        for v in range(logp.size(1))), key=lambda c: -c[0])[:budget]
        live = []
        for s, h in cands:
            if h[-1] == EOS or t + 1 >= limit:
                finished.append((final_score(s, t, alpha), h))
                budget -= 1
            else:
                live.append((s, h))
        if not live:
            break
    return finished


# --------------------------------------------------------------------------- beam 1 is greedy


@pytest.mark.parametrize("B", [1, 6, 20])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_one_equals_greedy(B, alpha):
    rows = []
    for seed in SEEDS:
        model = random_model(seed)
        src, mask, lengths = random_sources(seed, B)
        max_len = lengths + 5  # per-sentence limits
        greedy = greedy_decode(model, src, mask, max_len, BOS, EOS, pad_symbol=FILL)
        beam = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=1, alpha=alpha, pad_symbol=FILL)
        assert torch.equal(beam, greedy), (seed, beam, greedy)
        rows += [generated(r) for r in greedy.tolist()]
    if B > 1:  # the end symbol really is emitted, at different lengths, and some sentences hit the limit
        assert any(r[-1] == EOS for r in rows) and any(r[-1] != EOS for r in rows)
        assert len({len(r) for r in rows}) > 3


def test_beam_one_equals_greedy_without_end_symbol_emitted():
    model = random_model(3, eos_bias=-20.0)  # </s> never wins: every sentence runs to its limit
    src, mask, lengths = random_sources(3, 5)
    max_len = lengths + 2
    greedy = greedy_decode(model, src, mask, max_len, BOS, EOS, pad_symbol=FILL)
    beam = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=1, pad_symbol=FILL)
    assert torch.equal(beam, greedy)
    assert all(EOS not in r for r in beam.tolist())


def test_beam_one_equals_greedy_under_bf16_autocast():
    # bf16 logits tie often; beam 1 must break ties as greedy_decode's argmax does.
    model = random_model(8)
    src, mask, lengths = random_sources(8, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        greedy = greedy_decode(model, src, mask, lengths + 5, BOS, EOS, pad_symbol=FILL)
        beam = beam_search(model, src, mask, lengths + 5, BOS, EOS, beam_size=1, pad_symbol=FILL)
    assert torch.equal(beam, greedy)


def test_decode_batch_dispatches():
    model = random_model(9)
    src, mask, _ = random_sources(9, 4)
    assert torch.equal(decode_batch(model, src, mask, 12, BOS, EOS, pad_symbol=FILL),
                       greedy_decode(model, src, mask, 12, BOS, EOS, pad_symbol=FILL))
    assert torch.equal(decode_batch(model, src, mask, 12, BOS, EOS, beam_size=3, alpha=0.2, pad_symbol=FILL),
                       beam_search(model, src, mask, 12, BOS, EOS, beam_size=3, alpha=0.2, pad_symbol=FILL))
    with pytest.raises(ValueError, match="beam_size"):
        decode_batch(model, src, mask, 12, BOS, EOS, beam_size=0)


# --------------------------------------------------------------------------- beam k >= 2


@pytest.mark.parametrize("k,alpha", [(2, 0.6), (4, 0.6), (4, 0.0), (5, 1.0)])
def test_beam_equals_plain_beam_search(k, alpha):
    """The batched, cached, early-stopping search returns what the plain search to the limit returns."""
    for seed in range(2):
        model = random_model(seed)
        src, mask, lengths = random_sources(seed + 10, 5)
        max_len = lengths + 4
        out = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=k, alpha=alpha, pad_symbol=FILL)
        for i in range(5):
            L = int(lengths[i])
            hyp, score = plain_beam(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], int(max_len[i]), k, alpha)
            got = generated(out[i].tolist())
            assert got == hyp, (seed, i, got, hyp)
            total = log_prob_sums(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], [got])[0]
            assert final_score(total, len(got), alpha) == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("k,n,alpha,seed", [(4, 3, 0.6, 0), (5, 5, 1.0, 1), (3, 1, 0.0, 0)])
def test_n_best_lists_are_the_plain_searchs_best_finished_hypotheses(k, n, alpha, seed):
    """n-best lists run to the n-th best's bound: the n best the plain search to the limit finishes, best first,
    scored as it scores them; the first is beam_search's answer."""
    model = random_model(seed)
    src, mask, lengths = random_sources(seed + 10, 5)
    max_len = lengths + 4
    best = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=k, alpha=alpha, pad_symbol=FILL)
    lists = beam_search_n_best(model, src, mask, max_len, BOS, EOS, beam_size=k, alpha=alpha, n_best=n)
    for i, found in enumerate(lists):
        L = int(lengths[i])
        plain = sorted(plain_finished(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], int(max_len[i]), k, alpha),
                       key=lambda f: -f[0])[:n]
        assert len(found) == n and all(ids[0] == BOS for ids, _ in found)
        assert [ids[1:] for ids, _ in found] == [h for _, h in plain], i
        scores = [score for _, score in found]
        assert scores == pytest.approx([score for score, _ in plain], abs=1e-5)
        assert all(math.isfinite(s) for s in scores) and scores == sorted(scores, reverse=True)
        assert found[0][0] == [BOS, *generated(best[i].tolist())]
    with pytest.raises(ValueError, match="n_best must be between 1 and beam_size"):
        beam_search_n_best(model, src, mask, max_len, BOS, EOS, beam_size=2, n_best=3)


def test_greedy_scores_are_the_sum_of_log_probabilities():
    """greedy_search(return_scores=True): the same tokens, and each sentence's sum of log p, as teacher forcing
    gives it; decode_n_best at beam 1 scores them as beam search with one beam does."""
    for seed in SEEDS[:2]:
        model = random_model(seed)
        src, mask, lengths = random_sources(seed, 6)
        max_len = lengths + 5
        plain = incremental.greedy_search(model, src, mask, max_len, BOS, EOS, FILL)
        out, scores = incremental.greedy_search(model, src, mask, max_len, BOS, EOS, FILL, return_scores=True)
        assert torch.equal(out, plain) and scores.shape == (6,) and scores.dtype == torch.float32
        for i in range(6):
            L = int(lengths[i])
            total = log_prob_sums(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], [generated(out[i].tolist())])[0]
            assert float(scores[i]) == pytest.approx(total, abs=1e-4)
        greedy = decode_n_best(model, src, mask, max_len, BOS, EOS, beam_size=1, alpha=0.6, n_best=1, pad_symbol=FILL)
        beam = beam_search_n_best(model, src, mask, max_len, BOS, EOS, beam_size=1, alpha=0.6, n_best=1)
        for [(g_ids, g_score)], [(b_ids, b_score)] in zip(greedy, beam):
            assert [BOS, *generated(g_ids)] == b_ids and g_score == pytest.approx(b_score, abs=1e-5)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_beam_scores_at_least_greedy(k):
    """Beam search finds hypotheses at least as good as greedy's, under the same length penalty.

    Not a theorem: the greedy path can fall out of a narrow beam. With k = 2 it does here once
    (seed 0, sentence 5: two extensions of the runner-up first token outrank the greedy path, and
    the survivor runs to the limit), so for k = 2 only the corpus total is compared.
    """
    alpha = 0.6
    total_greedy = total_beam = 0.0
    for seed in range(3):
        model = random_model(seed, eos_bias=0.5)
        src, mask, lengths = random_sources(seed + 20, 8)
        max_len = lengths + 5
        greedy = greedy_decode(model, src, mask, max_len, BOS, EOS, pad_symbol=FILL)
        beam = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=k, alpha=alpha, pad_symbol=FILL)
        for i in range(src.size(0)):
            L = int(lengths[i])
            g, b = generated(greedy[i].tolist()), generated(beam[i].tolist())
            sg, sb = log_prob_sums(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], [g, b])
            fg, fb = final_score(sg, len(g), alpha), final_score(sb, len(b), alpha)
            total_greedy, total_beam = total_greedy + fg, total_beam + fb
            if k > 2:
                assert fb >= fg - 1e-5, (seed, i, g, b)  # fp32 rounding of two batch rows
    assert total_beam > total_greedy


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exact_best_sequence(alpha):
    """V=5, 3 generated tokens at most: a beam as wide as the whole space is exhaustive search."""
    V, limit = 5, 4
    model = random_model(11, V=V, eos_bias=0.3)
    src, mask, lengths = random_sources(11, 3, V=V)
    space = [list(h) for n in range(1, limit) for h in itertools.product(range(V), repeat=n)
             if EOS not in h[:-1] and (h[-1] == EOS or n == limit - 1)]
    assert len(space) == 1 + 4 + 4 * 4 * 5
    out = beam_search(model, src, mask, limit, BOS, EOS, beam_size=V ** (limit - 1), alpha=alpha, pad_symbol=FILL)
    for i in range(3):
        L = int(lengths[i])
        totals = log_prob_sums(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], space)
        finals = [final_score(s, len(h), alpha) for s, h in zip(totals, space)]
        best = max(range(len(space)), key=finals.__getitem__)
        got = generated(out[i].tolist())
        assert got == space[best], (i, got, space[best])
        runner_up = sorted(finals)[-2]
        assert finals[best] - runner_up > 1e-6  # the optimum is unique, so the equality above is meaningful


def test_batched_equals_one_at_a_time():
    model = random_model(5)
    src, mask, lengths = random_sources(5, 9)
    max_len = lengths + 6
    batched = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=4, pad_symbol=FILL)
    for i in range(9):
        L = int(lengths[i])
        single = beam_search(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], int(max_len[i]), BOS, EOS,
                             beam_size=4, pad_symbol=FILL)
        assert generated(batched[i].tolist()) == generated(single[0].tolist())


def test_output_format_and_limits():
    model = random_model(6)
    src, mask, lengths = random_sources(6, 10)
    max_len = lengths.clamp(max=7)
    out = beam_search(model, src, mask, max_len, BOS, EOS, beam_size=3, pad_symbol=FILL)
    rows = out.tolist()
    assert out.size(1) == max(1 + len(generated(r)) for r in rows)  # no all-filling columns
    for row, limit in zip(rows, max_len.tolist()):
        assert row[0] == BOS
        g = generated(row)
        assert 1 <= len(g) <= limit - 1
        assert all(t == FILL for t in row[1 + len(g):])  # filling after the hypothesis
        assert EOS not in g[:-1]
    assert any(r[-1] != EOS for r in map(generated, rows))  # some were cut at their limit
    # The default filling is the end symbol; a limit of 1 leaves only the start symbol.
    out = beam_search(model, src[:2], mask[:2], torch.tensor([1, 6]), BOS, EOS, beam_size=2)
    assert out[0].tolist() == [BOS] + [EOS] * (out.size(1) - 1)
    assert beam_search(model, src, mask, 1, BOS, EOS).shape == (10, 1)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, 5, BOS, EOS, beam_size=0)


def test_finished_hypotheses_and_sentences_leave_the_working_batch():
    model = random_model(6)
    src, mask, _ = random_sources(6, 12)
    k = 4
    sizes: list[int] = []
    handle = model.decoder.norm.register_forward_hook(lambda m, args, out: sizes.append(out.size(0)))
    out = beam_search(model, src, mask, 30, BOS, EOS, beam_size=k, pad_symbol=FILL)
    handle.remove()
    assert sizes[0] == 12  # the first step runs on the start rows only
    assert max(sizes) <= 12 * k
    peak = sizes.index(max(sizes))
    assert sizes[peak:] == sorted(sizes[peak:], reverse=True) and sizes[-1] < max(sizes) // 2
    assert len(sizes) < 29  # nobody ran to the limit of 30
    assert sum(generated(r)[-1] == EOS for r in out.tolist()) == 12


@pytest.mark.parametrize("V", [8000, 6190, 5 * TOP_BLOCK + 1, 300])
@pytest.mark.parametrize("c", [2, 5, 10])
def test_top_indices_are_topks_whatever_block_holds_the_winners(V, c):
    g = torch.Generator().manual_seed(V + c)
    scores = torch.randn(40, V, generator=g)
    scores[0, -1] = 10.0  # the best entry in the last, partial block
    scores[1, -c:] = 10.0 + torch.arange(c)  # all c best at the very end
    scores[2, :c] = 10.0 + torch.arange(c)  # all c best in the first block
    # each block's best at its start
    scores[3, ::TOP_BLOCK] = 5.0 + torch.rand(len(range(0, V, TOP_BLOCK)), generator=g)
    assert torch.equal(top_indices(scores, c), scores.topk(c, dim=-1).indices)


def test_the_memory_stays_one_row_per_sentence_while_hypotheses_multiply(monkeypatch):
    """The encoder-decoder attention keeps its keys/values per working sentence, never per hypothesis."""
    model = random_model(6)
    src, mask, _ = random_sources(6, 12)
    seen: list[tuple[int, int]] = []  # (hypothesis rows, projected memory rows) at each step
    attend = incremental.cached_attention

    def record(attn, query, key, value, mask, cache):
        out = attend(attn, query, key, value, mask, cache)
        if attn is model.decoder.layers[0].src_attn:
            seen.append((query.size(0), cache.k.size(0)))
            assert out.shape == query.shape  # each hypothesis gets its own row back
        return out

    monkeypatch.setattr(incremental, "cached_attention", record)
    beam_search(model, src, mask, 30, BOS, EOS, beam_size=4, pad_symbol=FILL)
    assert max(rows for rows, _ in seen) > 12  # hypotheses outnumber sentences
    assert all(memory_rows <= min(rows, 12) for rows, memory_rows in seen)
    assert [m for _, m in seen] == sorted((m for _, m in seen), reverse=True)  # only done sentences leave


def test_length_penalty_convention():
    lp = length_penalty(torch.tensor([1, 5, 10]), 0.6)
    assert lp.dtype == torch.float32
    assert lp.tolist() == pytest.approx([1.0, (10 / 6) ** 0.6, (15 / 6) ** 0.6])
    assert length_penalty(torch.tensor([7]), 0.0).item() == 1.0
    assert math.isclose(length_penalty(torch.tensor([1]), 0.6).item(), 1.0)  # one token: no penalty
