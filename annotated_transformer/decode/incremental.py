"""Incremental decoding: the decoder run on the newest target position only, with its keys and values cached.

The paper's classes decode a whole prefix at once (`EncoderDecoder.decode`), and the notebook's
`greedy_decode` re-runs that prefix at every step. Here `decode_step` calls the same decoder modules,
in the same order, on the new position alone: each self-attention appends the position's keys/values
to its `AttentionCache`, each encoder-decoder attention projects the memory once. Its output equals
the last row of `model.decode` over the whole prefix (tests/test_greedy.py). `greedy_search` is
`greedy_decode` on top of it, with finished sentences dropped from the working batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import MultiHeadedAttention
from ..decoding import length_limits
from ..model import EncoderDecoder
from .kv_cache import AttentionCache, DecoderCache


def cached_attention(attn: MultiHeadedAttention, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
                     cache: AttentionCache) -> Tensor:
    """`attn(query, key, value, mask)` for the new query positions, the keys/values kept in `cache`."""
    if cache.static and cache.k is not None:
        k, v = cache.k, cache.v  # the memory, projected on the first step
    else:
        k, v = cache.update(attn._heads(key, attn.linears[1]), attn._heads(value, attn.linears[2]))  # (B, h, S, d_k)
    return attn.attend(query, k, v, mask)  # (B, T, d)


def longest_target(model: EncoderDecoder) -> int:
    """The most target positions `model` decodes: the length of its positional table (config: model.max_positions)."""
    return model.tgt_embed[1].pe.size(1)


def start_cache(model: EncoderDecoder) -> DecoderCache:
    """An empty cache for `decode_step` on `model`'s decoder."""
    return DecoderCache.empty(len(model.decoder.layers))


def decode_step(model: EncoderDecoder, memory: Tensor, src_mask: Tensor, tgt: Tensor, cache: DecoderCache) -> Tensor:
    """The decoder's output (B, T, d) for the next T target positions `tgt` (B, T), usually one.

    They attend to themselves and to every position in `cache`, which they join. A model that narrows
    what a target position sees (local attention) gives the mask through `step_mask(start, T, device)`.
    """
    start, T = cache.advance(tgt.size(1)), tgt.size(1)
    embed, position = model.tgt_embed  # Embeddings, PositionalEncoding
    if start + T > longest_target(model):
        raise ValueError(f"sequence of {start + T} positions exceeds the positional table ({longest_target(model)}); "
                         "raise model.max_positions")
    x = position.dropout(embed(tgt) + position.pe[:, start:start + T])  # (B, T, d)
    step_mask = getattr(model, "step_mask", None)
    if step_mask is not None:
        self_mask = step_mask(start, T, tgt.device)  # (1, T, start+T)
    else:  # each new position sees the cached ones and the new ones up to itself
        self_mask = torch.ones(T, start + T, dtype=torch.bool, device=tgt.device).tril(start).unsqueeze(0) \
            if T > 1 else None
    for layer, (self_cache, src_cache) in zip(model.decoder.layers, cache.layers):
        x = layer.sublayer[0](x, lambda y: cached_attention(layer.self_attn, y, y, y, self_mask, self_cache))
        x = layer.sublayer[1](x, lambda y: cached_attention(layer.src_attn, y, memory, memory, src_mask, src_cache))
        x = layer.sublayer[2](x, layer.feed_forward)
    return model.decoder.norm(x)


@torch.no_grad()
def greedy_search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                  start_symbol: int, end_symbol: int | None = None, pad_symbol: int | None = None,
                  return_scores: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """`greedy_decode`'s search and output, one cached `decode_step` a position.

    Sentences that finish are dropped from the working batch, so they cost nothing afterwards.
    Returns (B, L) ids with L <= max(max_len), token for token what `greedy_decode` returns; with
    `return_scores`, also each sentence's sum of log-probabilities of its tokens, (B,) fp32.
    """
    B, device = src.size(0), src.device
    limits = length_limits(max_len, B, device)
    L = int(limits.max())
    fill = end_symbol if pad_symbol is None else pad_symbol
    out = torch.full((B, max(L, 1)), fill if fill is not None else start_symbol, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    scores = torch.zeros(B, device=device) if return_scores else None  # (B,) fp32
    if L <= 1:
        return (out[:, :1], scores) if scores is not None else out[:, :1]
    active = (limits > 1).nonzero().squeeze(1)  # original row of each sentence still decoding
    if len(active) < B:  # a limit of 1 means the start symbol alone: never decode for those rows
        src, src_mask = src[active], src_mask[active]
    memory, src_mask = model.encode_memory(src, src_mask)  # (b, S, d); merged tokens: (b, S', d) and its mask
    cache = start_cache(model)
    tokens = out[active, :1]  # (b, 1): the newest token of each active sentence
    t = 0
    for t in range(1, L):
        x = decode_step(model, memory, src_mask, tokens, cache)  # (b, 1, d)
        # argmax of the logits equals argmax of the log-softmax: skip the normalisation (unless scores are asked for).
        logits = model.generator.logits(x[:, -1])  # (b, V)
        next_word = logits.argmax(dim=-1)  # (b,)
        out[active, t] = next_word
        if scores is not None:
            scores[active] += F.log_softmax(logits.float(), dim=-1).gather(1, next_word.unsqueeze(1)).squeeze(1)
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
    return (out[:, : t + 1], scores) if scores is not None else out[:, : t + 1]
