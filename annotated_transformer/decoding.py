"""Decoding: batched greedy search with a key/value cache, and the naive decoder it must match.

Every decoder returns a (B, L) tensor of ids that starts with the start symbol. A sentence ends
at its own end symbol (kept in the output) or at its length limit; positions after its end hold
`pad_symbol` (the end symbol when none is given). `translate_ids` decodes any number of id
sequences in length-sorted batches, as training's BLEU, the Translator and the charts do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .data.buckets import pad_rows
from .device import amp_context
from .kv_cache import DecoderCache
from .masks import padding_mask
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
    memory, src_mask = model.encode_memory(src, src_mask)  # (b, S, d); merged tokens: (b, S', d) and its mask
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
    """The naive decoder: re-run the decoder over the whole prefix at every step (the notebook's way), batched.

    Same contract and same output as `greedy_decode`; used to check the cache.
    """
    B, device = src.size(0), src.device
    limits = _limits(max_len, B, device)
    L = int(limits.max())
    fill = end_symbol if pad_symbol is None else pad_symbol
    memory, src_mask = model.encode_memory(src, src_mask)  # (B, S, d)
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
    beams = _start_beams(model, src, src_mask, limits, k, start_symbol)
    cache = model.init_cache()
    for t in range(1, L):
        val, parent, token = _rank_extensions(model, beams, cache, k)  # (b, k) each, best first
        # Keep the k - f best; a slot without a real candidate (-inf: too few live rows) is not kept.
        kept = (torch.arange(k, device=device) < beams.budget.unsqueeze(1)) & val.isfinite()  # (b, k)
        at_limit = (limits.index_select(0, beams.sent) <= t + 1).unsqueeze(1)  # (b, 1)
        ended = kept & ((token == end_symbol) | at_limit)  # (b, k)
        _keep_best_finished(beams, val, parent, token, ended, t, lp[t], out, best, best_len)
        beams.budget = beams.budget - ended.sum(dim=1)
        live = kept & ~ended  # (b, k)
        go_on = _can_still_improve(beams, live, val, best, limits, lp, t)  # (b,)
        if not bool(go_on.any()):
            break
        beams = _advance(beams, live & go_on.unsqueeze(1), go_on, val, parent, token, cache)
    return out[:, : int(best_len.max()) + 1]


@dataclass
class _Beams:
    """The working sentences of a beam search and their live hypotheses ("rows", by sentence, then slot)."""

    sent: Tensor  # (b,) original index of each working sentence
    budget: Tensor  # (b,) slots not yet used up by finished hypotheses (k - f)
    memory: Tensor  # (n, S, d) the encoder output, one row per live hypothesis
    mask: Tensor  # (n, 1, S)
    work: Tensor  # (n,) working sentence of each row
    slot: Tensor  # (n,) its slot 0..k-1 within that sentence
    score: Tensor  # (n,) fp32 sum of log-probabilities
    seq: Tensor  # (n, t) tokens so far, start symbol first


def _start_beams(model: EncoderDecoder, src: Tensor, src_mask: Tensor, limits: Tensor, k: int,
                 start_symbol: int) -> _Beams:
    """One row per sentence that can grow (a limit of 1 leaves only the start symbol): all k beams start alike."""
    sent = (limits > 1).nonzero().squeeze(1)  # (b,)
    n = sent.numel()
    rows = torch.arange(n, device=src.device)
    memory, mask = model.encode_memory(src, src_mask)  # (B, S, d), (B, 1, S); S' < S with token merging
    return _Beams(sent=sent, budget=torch.full((n,), k, dtype=torch.long, device=src.device),
                  memory=memory.index_select(0, sent), mask=mask.index_select(0, sent),
                  work=rows, slot=torch.zeros_like(rows), score=torch.zeros(n, device=src.device),
                  seq=torch.full((n, 1), start_symbol, dtype=torch.long, device=src.device))


def _rank_extensions(model: EncoderDecoder, beams: _Beams, cache: DecoderCache,
                     k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each working sentence's k best one-token extensions: (fp32 sums, parent rows (-1: none), tokens), (b, k)."""
    b, device = beams.sent.numel(), beams.sent.device
    x = model.decode(beams.memory, beams.mask, beams.seq[:, -1:], None, cache)  # (n, 1, d)
    # Generator.forward is exactly log_softmax(logits(x)); projecting once gives both the logits
    # (argmax with greedy_decode's tie-breaking, which bf16 makes matter) and fp32 log-probs.
    logits = model.generator.logits(x[:, -1])  # (n, V)
    logp = F.log_softmax(logits.float(), dim=-1)  # (n, V) fp32
    # Stage 1: each row's best c extensions; the sentence's best k extensions are among them.
    c = min(k, logits.size(-1))
    top = logits.argmax(-1, keepdim=True) if c == 1 else logits.topk(c, dim=-1).indices  # (n, c)
    cand = beams.score.unsqueeze(1) + logp.gather(1, top)  # (n, c) fp32 sums
    # Stage 2: per sentence, rank the candidates of all its rows; k slots x c candidates each.
    grid_row = beams.work * k + beams.slot  # (n,) row's place in the (b*k) slot grid
    grid = cand.new_full((b * k, c), float("-inf"))
    grid[grid_row] = cand
    row_of_grid = torch.full((b * k,), -1, dtype=torch.long, device=device)
    row_of_grid[grid_row] = torch.arange(grid_row.numel(), device=device)
    val, idx = grid.view(b, k * c).topk(k, dim=1)  # (b, k) best first
    parent = row_of_grid[torch.arange(b, device=device).unsqueeze(1) * k + idx // c]  # (b, k); -1: none
    return val, parent, top[parent.clamp(min=0), idx % c]


def _keep_best_finished(beams: _Beams, val: Tensor, parent: Tensor, token: Tensor, ended: Tensor, t: int,
                        lp_t: Tensor, out: Tensor, best: Tensor, best_len: Tensor) -> None:
    """Write each sentence's best hypothesis finished at step t into `out`, if it beats the best so far.

    All finish with length t, so the best final score is the best sum; max() returns the first,
    i.e. the best-ranked.
    """
    final = torch.where(ended, val / lp_t, float("-inf"))  # (b, k)
    step_best, step_rank = final.max(dim=1)  # (b,)
    better = (step_best > best.index_select(0, beams.sent)).nonzero().squeeze(1)  # (m,) working indices
    if better.numel():
        r = step_rank.index_select(0, better)  # (m,)
        p = parent[better, r]  # (m,) parent rows
        orig = beams.sent.index_select(0, better)  # (m,)
        out[orig, : t + 1] = torch.cat([beams.seq.index_select(0, p), token[better, r].unsqueeze(1)], dim=1)
        best[orig] = step_best.index_select(0, better)
        best_len[orig] = t


def _can_still_improve(beams: _Beams, live: Tensor, val: Tensor, best: Tensor, limits: Tensor, lp: Tensor,
                       t: int) -> Tensor:
    """(b,) True where some live hypothesis could still beat the sentence's best finished one."""
    live_best = torch.where(live, val, float("-inf")).amax(dim=1)  # (b,)
    lim = limits.index_select(0, beams.sent)  # (b,)
    reachable_lp = torch.maximum(lp[t + 1], lp[lim - 1])  # (b,) lp is monotone in |Y|: an end is the max
    return live.any(dim=1) & (live_best / reachable_lp > best.index_select(0, beams.sent))


def _advance(beams: _Beams, live: Tensor, go_on: Tensor, val: Tensor, parent: Tensor, token: Tensor,
             cache: DecoderCache) -> _Beams:
    """The next step's rows: each live extension copied from its parent row (cache, memory and mask too)."""
    w, r = live.nonzero(as_tuple=True)  # (n',) each: sorted by working sentence, then slot
    p = parent[w, r]  # (n',) parent rows
    new_work = go_on.long().cumsum(0) - 1  # (b,) working index after dropping done sentences
    keep = go_on.nonzero().squeeze(1)  # (b',)
    cache.index_select(p)
    return _Beams(sent=beams.sent.index_select(0, keep), budget=beams.budget.index_select(0, keep),
                  memory=beams.memory.index_select(0, p), mask=beams.mask.index_select(0, p),
                  work=new_work[w], slot=r, score=val[w, r],
                  seq=torch.cat([beams.seq.index_select(0, p), token[w, r].unsqueeze(1)], dim=1))


def decode_batch(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                 start_symbol: int, end_symbol: int, beam_size: int = 1, alpha: float = 0.6,
                 pad_symbol: int | None = None) -> Tensor:
    """Greedy search for beam_size 1, beam search otherwise; same arguments and output format."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if beam_size == 1:
        return greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol, pad_symbol)
    return beam_search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, pad_symbol)


def translate_ids(model: EncoderDecoder, sources: Sequence[Sequence[int]], *, pad: int, bos: int, eos: int,
                  device: torch.device, beam_size: int = 1, alpha: float = 0.6, max_len_a: int = 50,
                  batch_size: int = 128, amp_dtype: torch.dtype | None = None) -> list[list[int]]:
    """Decode id sequences (each <s> ... </s>) in length-sorted batches; return output ids in input order.

    Each output starts after <s> and stops before </s> (both removed). The longest output of a
    sentence is its source length + `max_len_a` tokens, capped by the positional table.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    cap = model.max_positions
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        src = pad_rows([sources[i] for i in idx], pad).to(device)  # (B, S)
        lengths = torch.tensor([len(sources[i]) for i in idx])
        max_len = (lengths + max_len_a).clamp(max=cap)
        with torch.no_grad(), amp_context(device, amp_dtype):
            out = decode_batch(model, src, padding_mask(src, pad), max_len, bos, eos,
                               beam_size=beam_size, alpha=alpha, pad_symbol=pad)
        for row, i in enumerate(out.tolist()):
            results[idx[row]] = strip_special(i, bos, eos, pad)
    model.train(was_training)
    return results
