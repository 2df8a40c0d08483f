"""Beam search over a batch of sentences, with the key/value cache of `incremental.py` (Wu et al. 2016's length
penalty).

The paper decodes with beam size 4 and length penalty alpha 0.6 (Section 6.1); the notebook decodes
greedily (`decoding.greedy_decode`), which is this search with one beam.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..decoding import length_limits
from ..model import EncoderDecoder
from .incremental import decode_step, start_cache
from .kv_cache import DecoderCache
from .query_grid import QueryGrid, QueryLayout, grouped_queries


def length_penalty(lengths: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14), as fp32.

    |Y| counts the generated tokens, the end symbol included and the start symbol not. One
    function serves both the final scores and the early-stopping bound, so that equal lengths
    always get bit-identical penalties (computed in float64, then rounded once).
    """
    return ((5.0 + lengths.double()) / 6.0).pow(alpha).float()


TOP_BLOCK = 64  # entries per block in `top_indices`: 64 and 8,000 pieces ran fastest of 32, 64 and 128


def top_indices(scores: Tensor, c: int) -> Tensor:
    """scores (n, V) -> (n, c): each row's c largest entries' indices, largest first, as `topk` gives them.

    `topk` over the whole row can cost more on a CPU than the log-softmax (docs/performance.md). Here
    one vectorised pass takes each block of TOP_BLOCK entries' maximum; the c largest entries lie in
    the c blocks with the largest maxima, so `topk` then only ranks those blocks and their
    c * TOP_BLOCK entries. Equal entries may come in another
    order than `topk`'s; the rows' scores are the same. On GPUs and for small V, `topk` itself.
    """
    n, V = scores.shape
    m = V // TOP_BLOCK  # whole blocks; the last V - m * TOP_BLOCK entries form one more
    if scores.device.type != "cpu" or m <= c:
        return scores.topk(c, dim=-1).indices
    block_max = scores[:, : m * TOP_BLOCK].view(n, m, TOP_BLOCK).amax(dim=-1)  # (n, m)
    if m * TOP_BLOCK < V:
        block_max = torch.cat([block_max, scores[:, m * TOP_BLOCK:].amax(dim=-1, keepdim=True)], dim=1)
    blocks = block_max.topk(c, dim=-1).indices  # (n, c)
    cols = (blocks.unsqueeze(-1) * TOP_BLOCK + torch.arange(TOP_BLOCK, device=scores.device)).view(n, -1)
    picked = scores.gather(1, cols.clamp(max=V - 1)).masked_fill(cols >= V, float("-inf"))  # (n, c * TOP_BLOCK)
    return cols.gather(1, picked.topk(c, dim=-1).indices)


Hypotheses = list[tuple[list[int], float]]  # one sentence's finished hypotheses, best first: (ids, final score)


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
    parent row with `index_select`, as is its self-attention cache. The memory, its mask and
    its projected keys/values stay one row per working sentence: the encoder-decoder attention
    reads each sentence's hypotheses as one group of queries (`query_grid.QueryGrid`), so
    hypotheses move without copying the memory.
    """
    return _search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, pad_symbol)[0]


@torch.no_grad()
def beam_search_n_best(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                       start_symbol: int, end_symbol: int, beam_size: int = 4, alpha: float = 0.6,
                       n_best: int = 2) -> list[Hypotheses]:
    """Each sentence's `n_best` (at most beam_size) best finished hypotheses of `beam_search`, best first.

    A hypothesis is (ids, score): the start symbol and its tokens (the end symbol kept, if it has one),
    and its final score sum log p(Y) / lp(|Y|). The first of each list is `beam_search`'s answer. A
    sentence's search stops when no live hypothesis can beat its n-th best finished one (the same
    exact bound as beam_search's, against the n-th best rather than the best).
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size ({beam_size}), got {n_best}")
    return _search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, None, n_best)[1]


def _search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor, start_symbol: int,
            end_symbol: int, beam_size: int, alpha: float, pad_symbol: int | None,
            n_best: int | None = None) -> tuple[Tensor, list[Hypotheses]]:
    """`beam_search`'s search and output; with `n_best`, also each sentence's n best hypotheses (else [])."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    k = beam_size
    B, device = src.size(0), src.device
    limits = length_limits(max_len, B, device) if B else torch.zeros(0, dtype=torch.long, device=device)
    L = int(limits.max()) if B else 1
    fill = end_symbol if pad_symbol is None else pad_symbol
    out = torch.full((B, max(L, 1)), fill, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    found: list[Hypotheses] = [[] for _ in range(B)] if n_best else []  # every finished hypothesis, by sentence
    if L <= 1:
        return out[:, :1], [[([start_symbol], 0.0)] for _ in found]
    best = torch.full((B,), float("-inf"), device=device)  # (B,) fp32: final score of the best finished
    nth = torch.full((B, n_best), float("-inf"), device=device) if n_best else None  # (B, n) n best final scores
    best_len = torch.zeros(B, dtype=torch.long, device=device)  # (B,) its generated length
    lp = length_penalty(torch.arange(L + 1, device=device), alpha)  # (L+1,) lp of every |Y| up to L
    beams = _start_beams(model, src, src_mask, limits, k, start_symbol)
    cache = start_cache(model)
    with grouped_queries(model) as layout:  # each sentence's hypotheses query its memory together
        for t in range(1, L):
            val, parent, token = _rank_extensions(model, beams, cache, k, layout)  # (b, k) each, best first
            # Keep the k - f best; a slot without a real candidate (-inf: too few live rows) is not kept.
            kept = (torch.arange(k, device=device) < beams.budget.unsqueeze(1)) & val.isfinite()  # (b, k)
            at_limit = (limits.index_select(0, beams.sent) <= t + 1).unsqueeze(1)  # (b, 1)
            ended = kept & ((token == end_symbol) | at_limit)  # (b, k)
            _keep_best_finished(beams, val, parent, token, ended, t, lp[t], out, best, best_len)
            if nth is not None:
                _record_finished(beams, val, parent, token, ended, lp[t], found, nth)
            beams.budget = beams.budget - ended.sum(dim=1)
            live = kept & ~ended  # (b, k)
            # Stop when nothing live can beat the best finished hypothesis (the n-th best, for n-best lists).
            go_on = _can_still_improve(beams, live, val, best if nth is None else nth[:, -1], limits, lp, t)
            if not bool(go_on.any()):
                break
            beams = _advance(beams, live & go_on.unsqueeze(1), go_on, val, parent, token, cache)
    # sorted() is stable: among equal scores the hypothesis finished first comes first, as beam_search's answer.
    n_best_lists = [sorted(f, key=lambda h: -h[1])[:n_best] or [([start_symbol], 0.0)] for f in found]
    return out[:, : int(best_len.max()) + 1], n_best_lists


@dataclass
class _Beams:
    """The working sentences of a beam search and their live hypotheses ("rows", by sentence, then slot)."""

    sent: Tensor  # (b,) original index of each working sentence
    budget: Tensor  # (b,) slots not yet used up by finished hypotheses (k - f)
    memory: Tensor  # (b, S, d) the encoder output, one row per working sentence
    mask: Tensor  # (b, 1, S)
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


def _rank_extensions(model: EncoderDecoder, beams: _Beams, cache: DecoderCache, k: int,
                     layout: QueryLayout) -> tuple[Tensor, Tensor, Tensor]:
    """Each working sentence's k best one-token extensions: (fp32 sums, parent rows (-1: none), tokens), (b, k)."""
    b, device = beams.sent.numel(), beams.sent.device
    grid_row = beams.work * k + beams.slot  # (n,) row's place in the (b*k) slot grid
    layout.grid = QueryGrid(grid_row, b, k)  # each sentence's rows read its memory together
    x = decode_step(model, beams.memory, beams.mask, beams.seq[:, -1:], cache)  # (n, 1, d)
    # Generator.forward is exactly log_softmax(logits(x)); projecting once gives both the logits
    # (argmax with greedy_decode's tie-breaking, which bf16 makes matter) and fp32 log-probs.
    logits = model.generator.logits(x[:, -1])  # (n, V)
    logp = F.log_softmax(logits.float(), dim=-1)  # (n, V) fp32
    # Stage 1: each row's best c extensions; the sentence's best k extensions are among them.
    c = min(k, logits.size(-1))
    top = logits.argmax(-1, keepdim=True) if c == 1 else top_indices(logits, c)  # (n, c)
    cand = beams.score.unsqueeze(1) + logp.gather(1, top)  # (n, c) fp32 sums
    # Stage 2: per sentence, rank the candidates of all its rows; k slots x c candidates each.
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


def _record_finished(beams: _Beams, val: Tensor, parent: Tensor, token: Tensor, ended: Tensor, lp_t: Tensor,
                     found: list[Hypotheses], nth: Tensor) -> None:
    """Append every hypothesis finished at this step to its sentence's list in `found` (best-ranked first), and
    merge their final scores into `nth` (B, n), each sentence's n best so far."""
    final = torch.where(ended, val / lp_t, float("-inf"))  # (b, k): as `_keep_best_finished` scores them
    merged = torch.cat([nth.index_select(0, beams.sent), final], dim=1)  # (b, n + k)
    nth[beams.sent] = merged.topk(nth.size(1), dim=1).values
    w, r = ended.nonzero(as_tuple=True)  # (m,) each: by working sentence, then rank
    seqs = torch.cat([beams.seq.index_select(0, parent[w, r]), token[w, r].unsqueeze(1)], dim=1)  # (m, t + 1)
    for sent, ids, score in zip(beams.sent[w].tolist(), seqs.tolist(), final[w, r].tolist()):
        found[sent].append((ids, score))


def _can_still_improve(beams: _Beams, live: Tensor, val: Tensor, best: Tensor, limits: Tensor, lp: Tensor,
                       t: int) -> Tensor:
    """(b,) True where some live hypothesis could still beat the sentence's `best` (B,) finished score."""
    live_best = torch.where(live, val, float("-inf")).amax(dim=1)  # (b,)
    lim = limits.index_select(0, beams.sent)  # (b,)
    reachable_lp = torch.maximum(lp[t + 1], lp[lim - 1])  # (b,) lp is monotone in |Y|: an end is the max
    return live.any(dim=1) & (live_best / reachable_lp > best.index_select(0, beams.sent))


def _advance(beams: _Beams, live: Tensor, go_on: Tensor, val: Tensor, parent: Tensor, token: Tensor,
             cache: DecoderCache) -> _Beams:
    """The next step's rows: each live extension copied from its parent row (with its self-attention cache);
    the memory, its mask and its projections lose the sentences that are done."""
    w, r = live.nonzero(as_tuple=True)  # (n',) each: sorted by working sentence, then slot
    p = parent[w, r]  # (n',) parent rows
    new_work = go_on.long().cumsum(0) - 1  # (b,) working index after dropping done sentences
    keep = go_on.nonzero().squeeze(1)  # (b',)
    dropped = keep.numel() < go_on.numel()
    for self_cache, src_cache in cache.layers:
        self_cache.index_select(p)
        if dropped:
            src_cache.index_select(keep)
    memory, mask = beams.memory, beams.mask
    if dropped:
        memory, mask = memory.index_select(0, keep), mask.index_select(0, keep)
    return _Beams(sent=beams.sent.index_select(0, keep), budget=beams.budget.index_select(0, keep),
                  memory=memory, mask=mask,
                  work=new_work[w], slot=r, score=val[w, r],
                  seq=torch.cat([beams.seq.index_select(0, p), token[w, r].unsqueeze(1)], dim=1))
