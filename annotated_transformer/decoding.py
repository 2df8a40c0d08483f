"""Decoding: batched greedy search with a key/value cache, and the naive reference it must match.

Every decoder returns a (B, L) tensor of ids that starts with the start symbol. A sentence ends
at its own end symbol (kept in the output) or at its length limit; positions after its end hold
`pad_symbol` (the end symbol when none is given).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import EncoderDecoder, subsequent_mask


def _limits(max_len: int | Tensor, batch: int, device: torch.device) -> Tensor:
    """Per-sentence output length limits (start symbol included), as a (B,) long tensor."""
    if isinstance(max_len, Tensor):
        return max_len.to(device=device, dtype=torch.long).reshape(batch)
    return torch.full((batch,), int(max_len), dtype=torch.long, device=device)


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                  start_symbol: int, end_symbol: int | None = None, pad_symbol: int | None = None) -> Tensor:
    """Pick the most probable next token, one position at a time, for a whole batch.

    src (B, S), src_mask (B, 1, S); `max_len` (an int, or a (B,) tensor of per-sentence limits)
    counts the start symbol. Each step feeds only the newest token: the decoder's self-attention
    keys/values are cached per layer, and the memory's keys/values are projected once. Sentences
    that finish are dropped from the working batch, so they cost nothing afterwards.
    Returns (B, L) ids with L <= max(max_len).
    """
    B, device = src.size(0), src.device
    limits = _limits(max_len, B, device)
    L = int(limits.max())
    fill = end_symbol if pad_symbol is None else pad_symbol
    out = torch.full((B, max(L, 1)), fill if fill is not None else start_symbol, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    if L <= 1:
        return out[:, :1]
    active = (limits > 1).nonzero().squeeze(1)  # original row of each sentence still decoding
    if len(active) < B:  # a limit of 1 means the start symbol alone: never decode for those rows
        src, src_mask = src[active], src_mask[active]
    memory = model.encode(src, src_mask)  # (b, S, d)
    cache = model.init_cache()
    tokens = out[active, :1]  # (b, 1): the newest token of each active sentence
    t = 0
    for t in range(1, L):
        x = model.decode(memory, src_mask, tokens, None, cache)  # (b, 1, d)
        # argmax of the logits equals argmax of the log-softmax: skip the normalisation.
        next_word = model.generator.logits(x[:, -1]).argmax(dim=-1)  # (b,)
        out[active, t] = next_word
        done = limits[active] <= t + 1
        if end_symbol is not None:
            done |= next_word == end_symbol
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)  # (b',)
            active, next_word = active[keep], next_word[keep]
            memory, src_mask = memory[keep], src_mask[keep]
            cache.index_select(keep)
        tokens = next_word.unsqueeze(1)  # (b, 1)
    return out[:, : t + 1]


@torch.no_grad()
def greedy_decode_naive(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                        start_symbol: int, end_symbol: int | None = None,
                        pad_symbol: int | None = None) -> Tensor:
    """The reference: re-run the decoder over the whole prefix at every step (the notebook's way), batched.

    Same contract and same output as `greedy_decode`; used to check the cache.
    """
    B, device = src.size(0), src.device
    limits = _limits(max_len, B, device)
    L = int(limits.max())
    fill = end_symbol if pad_symbol is None else pad_symbol
    memory = model.encode(src, src_mask)  # (B, S, d)
    ys = torch.full((B, 1), start_symbol, dtype=torch.long, device=device)
    finished = limits <= 1
    for t in range(1, L):
        out = model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1), device=device))  # (B, t, d)
        next_word = model.generator.logits(out[:, -1]).argmax(dim=-1)  # (B,): same scoring as greedy_decode
        if fill is not None:
            next_word = next_word.masked_fill(finished, fill)
        ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)  # (B, t+1)
        finished = finished | (limits <= t + 1)
        if end_symbol is not None:
            finished |= next_word == end_symbol
        if bool(finished.all()):
            break
    return ys


def strip_special(ids: list[int], start_symbol: int, end_symbol: int | None, pad_symbol: int | None = None) -> list[int]:
    """Drop the leading start symbol and everything from the end symbol on."""
    out = ids[1:] if ids and ids[0] == start_symbol else list(ids)
    if end_symbol is not None and end_symbol in out:
        out = out[: out.index(end_symbol)]
    if pad_symbol is not None and pad_symbol != end_symbol:
        out = [i for i in out if i != pad_symbol]
    return out


# --------------------------------------------------------------------------- beam search


def length_penalty(lengths: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14), as fp32.

    |Y| counts the generated tokens, the end symbol included and the start symbol not. One
    function serves both the final scores and the early-stopping bound, so that equal lengths
    always get bit-identical penalties (computed in float64, then rounded once).
    """
    return ((5.0 + lengths.double()) / 6.0).pow(alpha).float()


@torch.no_grad()
def beam_search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                start_symbol: int, end_symbol: int, beam_size: int = 4, alpha: float = 0.6,
                pad_symbol: int | None = None) -> Tensor:
    """Beam search over a batch of sentences, with the key/value cache; the best hypothesis of each.

    src (B, S), src_mask (B, 1, S); `max_len` (an int, or a (B,) tensor of per-sentence limits)
    counts the start symbol, as in `greedy_decode`. Returns (B, L) ids in `greedy_decode`'s format:
    the start symbol, the hypothesis (its end symbol kept), then `pad_symbol` (default: the end
    symbol) filling.

    The search (a "shrinking" beam): each sentence owns `beam_size` = k slots. At every step the
    k - f best one-token extensions of its live hypotheses are kept, ranked by their sum of
    log-probabilities (fp32), where f counts its hypotheses already finished (all extensions at
    one step have the same length, so the length penalty would not change that ranking). A kept
    extension finishes when it is the end symbol or when it reaches the sentence's length limit
    (it is then cut there, without an end symbol, as greedy_decode does); each finished
    hypothesis uses up its slot for good. A finished hypothesis Y scores  sum log p(Y) / lp(|Y|)  (`length_penalty`);
    the best such score is the sentence's answer (on a tie, the one finished first).

    Stopping rule, per sentence: it is done when it has no live hypothesis left (all k slots
    finished, or the length limit reached), or as soon as no live hypothesis can still beat its
    best finished one. That early stop is exact: log-probabilities are <= 0, so a live hypothesis
    with sum S can at best finish with score S / max(lp) over the lengths it can still reach; when
    that bound is <= the best finished score, continuing would not change the answer. It only
    saves the steps of hopeless hypotheses that would otherwise run to the length limit.

    With beam_size 1 this is greedy search exactly, for any alpha: one slot, the argmax extension
    (same tie-breaking as greedy_decode), ended at the end symbol or the limit.

    Done sentences leave the working batch, and so do finished hypotheses: the decoder only ever
    runs on live hypotheses. The first step runs on the B start rows alone (all k beams of a
    sentence would be identical); afterwards each kept extension becomes a row, copied from its
    parent row with `index_select`, which also reorders the cache, the memory and the mask.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    k = beam_size
    B, device = src.size(0), src.device
    limits = _limits(max_len, B, device) if B else torch.zeros(0, dtype=torch.long, device=device)
    L = int(limits.max()) if B else 1
    fill = end_symbol if pad_symbol is None else pad_symbol
    out = torch.full((B, max(L, 1)), fill, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    if L <= 1:
        return out[:, :1]
    best = torch.full((B,), float("-inf"), device=device)  # (B,) fp32: final score of the best finished
    best_len = torch.zeros(B, dtype=torch.long, device=device)  # (B,) its generated length
    lp = length_penalty(torch.arange(L + 1, device=device), alpha)  # (L+1,) lp of every |Y| up to L

    # The working batch: sentences still searching (a limit of 1 leaves only the start symbol).
    sent = (limits > 1).nonzero().squeeze(1)  # (b,) original index of each working sentence
    budget = torch.full((sent.numel(),), k, dtype=torch.long, device=device)  # (b,) k - finished
    memory = model.encode(src, src_mask).index_select(0, sent)  # (b, S, d): one row per live hypothesis
    mask = src_mask.index_select(0, sent)  # (b, 1, S)
    # Live hypotheses ("rows"), ordered by working sentence, then by slot.
    row_work = torch.arange(sent.numel(), device=device)  # (n,) working sentence of each row
    row_slot = torch.zeros_like(row_work)  # (n,) its slot 0..k-1 within that sentence
    row_score = torch.zeros(sent.numel(), device=device)  # (n,) fp32 sum of log-probabilities
    row_seq = torch.full((sent.numel(), 1), start_symbol, dtype=torch.long, device=device)  # (n, t)
    cache = model.init_cache()
    for t in range(1, L):
        b = sent.numel()
        x = model.decode(memory, mask, row_seq[:, -1:], None, cache)  # (n, 1, d)
        # Generator.forward is exactly log_softmax(logits(x)); projecting once gives both the logits
        # (argmax with greedy_decode's tie-breaking, which bf16 makes matter) and fp32 log-probs.
        logits = model.generator.logits(x[:, -1])  # (n, V)
        logp = F.log_softmax(logits.float(), dim=-1)  # (n, V) fp32
        # Stage 1: each row's best c extensions; the sentence's best k extensions are among them.
        c = min(k, logits.size(-1))
        top = logits.argmax(-1, keepdim=True) if c == 1 else logits.topk(c, dim=-1).indices  # (n, c)
        cand = row_score.unsqueeze(1) + logp.gather(1, top)  # (n, c) fp32 sums
        # Stage 2: per sentence, rank the candidates of all its rows; k slots x c candidates each.
        grid_row = row_work * k + row_slot  # (n,) row's place in the (b*k) slot grid
        grid = cand.new_full((b * k, c), float("-inf"))
        grid[grid_row] = cand
        row_of_grid = torch.full((b * k,), -1, dtype=torch.long, device=device)
        row_of_grid[grid_row] = torch.arange(grid_row.numel(), device=device)
        val, idx = grid.view(b, k * c).topk(k, dim=1)  # (b, k) best first
        parent = row_of_grid[torch.arange(b, device=device).unsqueeze(1) * k + idx // c]  # (b, k); -1: none
        token = top[parent.clamp(min=0), idx % c]  # (b, k)
        # Keep the k - f best; a slot without a real candidate (-inf: too few live rows) is not kept.
        rank = torch.arange(k, device=device)
        kept = (rank < budget.unsqueeze(1)) & val.isfinite()  # (b, k)
        at_limit = (limits.index_select(0, sent) <= t + 1).unsqueeze(1)  # (b, 1)
        ended = kept & ((token == end_symbol) | at_limit)  # (b, k)

        # Finished hypotheses: keep each sentence's best (all have length t this step, so the
        # best final score is the best sum; max() returns the first, i.e. the best-ranked).
        final = torch.where(ended, val / lp[t], float("-inf"))  # (b, k)
        step_best, step_rank = final.max(dim=1)  # (b,)
        better = (step_best > best.index_select(0, sent)).nonzero().squeeze(1)  # (m,) working indices
        if better.numel():
            r = step_rank.index_select(0, better)  # (m,)
            p = parent[better, r]  # (m,) parent rows
            orig = sent.index_select(0, better)  # (m,)
            out[orig, : t + 1] = torch.cat([row_seq.index_select(0, p), token[better, r].unsqueeze(1)], dim=1)
            best[orig] = step_best.index_select(0, better)
            best_len[orig] = t
        budget = budget - ended.sum(dim=1)

        # Which sentences go on: some hypothesis is live and could still beat the best finished.
        live = kept & ~ended  # (b, k)
        live_best = torch.where(live, val, float("-inf")).amax(dim=1)  # (b,)
        lim = limits.index_select(0, sent)  # (b,)
        reachable_lp = torch.maximum(lp[t + 1], lp[lim - 1])  # (b,) lp is monotone in |Y|: an end is the max
        go_on = live.any(dim=1) & (live_best / reachable_lp > best.index_select(0, sent))  # (b,)
        if not bool(go_on.any()):
            break
        live &= go_on.unsqueeze(1)
        w, r = live.nonzero(as_tuple=True)  # (n',) each: sorted by working sentence, then slot
        p = parent[w, r]  # (n',) parent rows
        new_work = go_on.long().cumsum(0) - 1  # (b,) working index after dropping done sentences
        row_work, row_slot, row_score = new_work[w], r, val[w, r]
        row_seq = torch.cat([row_seq.index_select(0, p), token[w, r].unsqueeze(1)], dim=1)  # (n', t+1)
        memory, mask = memory.index_select(0, p), mask.index_select(0, p)  # (n', S, d), (n', 1, S)
        cache.index_select(p)
        keep_sent = go_on.nonzero().squeeze(1)  # (b',)
        sent, budget = sent.index_select(0, keep_sent), budget.index_select(0, keep_sent)
    return out[:, : int(best_len.max()) + 1]


def decode_batch(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                 start_symbol: int, end_symbol: int, beam_size: int = 1, alpha: float = 0.6,
                 pad_symbol: int | None = None) -> Tensor:
    """Greedy search for beam_size 1, beam search otherwise; same arguments and output format."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if beam_size == 1:
        return greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol, pad_symbol)
    return beam_search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, pad_symbol)
