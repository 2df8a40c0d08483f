"""Greedy decoding (the notebook's `greedy_decode`), batched, with a key/value cache.

Every decoder returns a (B, L) tensor of ids that starts with the start symbol. A sentence ends
at its own end symbol (kept in the output) or at its length limit; positions after its end hold
`pad_symbol` (the end symbol when none is given). Beam search is `decode/beam_search.py`; decoding many
sentences in length-sorted batches is `decode/inference.py`; the notebook's own decoder, which re-runs the
whole prefix every step, is `lab/notebook_decoding.py`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model import EncoderDecoder


def length_limits(max_len: int | Tensor, batch: int, device: torch.device) -> Tensor:
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
    limits = length_limits(max_len, B, device)
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


def strip_special(ids: list[int], start_symbol: int, end_symbol: int | None,
                  pad_symbol: int | None = None) -> list[int]:
    """Drop the leading start symbol and everything from the end symbol on."""
    out = ids[1:] if ids and ids[0] == start_symbol else list(ids)
    if end_symbol is not None and end_symbol in out:
        out = out[: out.index(end_symbol)]
    if pad_symbol is not None and pad_symbol != end_symbol:
        out = [i for i in out if i != pad_symbol]
    return out
