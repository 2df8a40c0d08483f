"""Batched greedy decoding with the key/value cache (decode.greedy_search) equals the notebook's greedy_decode, which
re-runs the decoder over the whole prefix."""

import pytest
import torch

from annotated_transformer import greedy_decode, make_model, subsequent_mask
from annotated_transformer.decode.incremental import decode_step, greedy_search, start_cache
from annotated_transformer.decode.inference import strip_special

BOS, EOS, PAD = 0, 1, 2


def random_model(seed: int, V: int = 15, norm_first: bool = True):
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.1, norm_first=norm_first).eval()
    with torch.no_grad():  # make </s> likely enough that sentences end at different lengths
        model.generator.proj.bias[EOS] += 1.5
    return model


def random_sources(seed: int, B: int, V: int = 15):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (B,), generator=g)
    src = torch.full((B, int(lengths.max())), PAD)
    for i, L in enumerate(lengths.tolist()):
        src[i, :L] = torch.cat([torch.tensor([BOS]), torch.randint(4, V, (L - 2,), generator=g), torch.tensor([EOS])])
    return src, (src != PAD).unsqueeze(-2), lengths


@pytest.mark.parametrize("B", [1, 7, 32])
@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_greedy_equals_naive(B, norm_first):
    for seed in range(3):
        model = random_model(seed, norm_first=norm_first)
        src, mask, lengths = random_sources(seed, B)
        max_len = lengths + 6  # per-sentence limits
        fast = greedy_search(model, src, mask, max_len, BOS, EOS, pad_symbol=PAD)
        slow = greedy_decode(model, src, mask, max_len, BOS, EOS, pad_symbol=PAD)
        assert torch.equal(fast, slow), (seed, fast, slow)


def test_each_sentence_stops_at_its_own_end_symbol():
    model = random_model(4)
    src, mask, lengths = random_sources(4, 16)
    out = greedy_search(model, src, mask, 25, BOS, EOS, pad_symbol=PAD)
    ended = 0
    for row in out.tolist():
        assert row[0] == BOS
        if EOS in row:
            ended += 1
            after = row[row.index(EOS) + 1:]
            assert all(t == PAD for t in after)  # nothing is generated after </s>
    assert 0 < ended
    lens = {len(strip_special(r, BOS, EOS, PAD)) for r in out.tolist()}
    assert len(lens) > 1  # sentences really ended at different lengths


def test_batched_equals_one_at_a_time():
    model = random_model(5)
    src, mask, lengths = random_sources(5, 9)
    batched = greedy_search(model, src, mask, 20, BOS, EOS, pad_symbol=PAD)
    for i in range(9):
        L = int(lengths[i])
        single = greedy_search(model, src[i:i + 1, :L], mask[i:i + 1, :, :L], 20, BOS, EOS, pad_symbol=PAD)
        a = strip_special(batched[i].tolist(), BOS, EOS, PAD)
        b = strip_special(single[0].tolist(), BOS, EOS, PAD)
        assert a == b


def test_finished_sentences_leave_the_working_batch():
    model = random_model(6)
    src, mask, _ = random_sources(6, 12)
    sizes = []
    handle = model.decoder.norm.register_forward_hook(lambda m, args, out: sizes.append(out.size(0)))
    out = greedy_search(model, src, mask, 30, BOS, EOS, pad_symbol=PAD)
    handle.remove()
    assert sizes[0] == 12
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 12
    finished_early = sum(1 for r in out.tolist() if EOS in r[:-1])
    assert finished_early > 0


def test_no_end_symbol_runs_to_max_len():
    model = random_model(7)
    src, mask, _ = random_sources(7, 3)
    out = greedy_search(model, src, mask, 9, BOS)
    assert out.shape == (3, 9)
    assert torch.equal(out, greedy_decode(model, src, mask, 9, BOS))


def test_a_limit_of_one_yields_only_the_start_symbol():
    model = random_model(8)
    src, mask, _ = random_sources(8, 3)
    limits = torch.tensor([1, 4, 1])
    fast = greedy_search(model, src, mask, limits, BOS, EOS, pad_symbol=PAD)
    slow = greedy_decode(model, src, mask, limits, BOS, EOS, pad_symbol=PAD)
    assert torch.equal(fast, slow)
    assert fast[0].tolist()[1:] == [PAD] * (fast.size(1) - 1)


def whole_prefix(seed: int, B: int, T: int, norm_first: bool = True):
    """A random model, its memory of B random sources and mask, T random target ids, and the paper's decode of them."""
    model = random_model(seed, norm_first=norm_first)
    src, mask, _ = random_sources(seed, B)
    tgt = torch.randint(3, 15, (B, T), generator=torch.Generator().manual_seed(seed))  # (B, T)
    memory = model.encode(src, mask)
    return model, memory, mask, tgt, model.decode(memory, mask, tgt, subsequent_mask(T)).detach()  # (B, T, d)


@pytest.mark.parametrize("norm_first", [True, False])
def test_a_cached_step_equals_the_last_row_of_the_whole_prefix(norm_first):
    """decode_step on one new position at a time gives what the paper's decode gives on the whole prefix."""
    model, memory, mask, tgt, full = whole_prefix(9, 5, 7, norm_first)
    cache = start_cache(model)
    with torch.no_grad():
        steps = torch.cat([decode_step(model, memory, mask, tgt[:, t:t + 1], cache) for t in range(7)], dim=1)
    assert cache.length == 7 and cache.layers[0][0].k.size(2) == 7  # one cached key per position decoded
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)


def test_a_step_past_the_positional_table_says_so():
    model = make_model(15, 15, N=1, d_model=16, d_ff=32, h=2, max_positions=3).eval()
    src = torch.tensor([[0, 5, 1]])
    memory, cache = model.encode(src, (src != 2).unsqueeze(1)), start_cache(model)
    with torch.no_grad():
        decode_step(model, memory, (src != 2).unsqueeze(1), torch.zeros(1, 3, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="exceeds the positional table"):
            decode_step(model, memory, (src != 2).unsqueeze(1), torch.zeros(1, 1, dtype=torch.long), cache)


def test_several_new_positions_in_one_step_attend_causally():
    """decode_step on a block of new positions (the cache's, then four at once) equals the whole prefix's rows."""
    model, memory, mask, tgt, full = whole_prefix(10, 3, 6)
    cache = start_cache(model)
    with torch.no_grad():
        first = decode_step(model, memory, mask, tgt[:, :2], cache)  # (B, 2, d)
        block = decode_step(model, memory, mask, tgt[:, 2:], cache)  # (B, 4, d)
    torch.testing.assert_close(torch.cat([first, block], dim=1), full, rtol=1e-5, atol=1e-5)


def test_without_end_or_pad_symbol_the_rows_past_their_limit_hold_the_start_symbol():
    model = random_model(11)
    src, mask, _ = random_sources(11, 3)
    limits = torch.tensor([2, 6, 4])
    out = greedy_decode(model, src, mask, limits, BOS)
    assert torch.equal(out, greedy_search(model, src, mask, limits, BOS))
    assert out[0, 2:].eq(BOS).all() and out[2, 4:].eq(BOS).all()
