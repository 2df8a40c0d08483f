"""Greedy decoding, the notebook's `greedy_decode`, for a batch of sentences; with a key/value cache it is
`decode.greedy_search`. A sentence ends at its end symbol (kept) or its length limit; the positions after
its end hold `pad_symbol` (else the end symbol, else the start symbol), as in every decoder's output."""

from __future__ import annotations

import torch
from torch import Tensor

from .masks import subsequent_mask
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
    counts the start symbol. As in the notebook, each step runs the decoder over the whole prefix.
    Returns (B, L) ids with L <= max(max_len).
    """
    B, device = src.size(0), src.device
    limits = length_limits(max_len, B, device)
    memory, src_mask = model.encode_memory(src, src_mask)  # (B, S, d)
    ys = torch.full((B, 1), start_symbol, dtype=torch.long, device=device)  # (B, 1)
    finished = limits <= 1
    for t in range(1, int(limits.max())):
        out = model.decode(memory, src_mask, ys, subsequent_mask(t, device=device))  # (B, t, d)
        # argmax of the logits equals argmax of the log-softmax: skip the normalisation.
        next_word = model.generator.logits(out[:, -1]).argmax(dim=-1)  # (B,)
        ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)  # (B, t + 1)
        finished = finished | (limits <= t + 1) | (next_word == end_symbol if end_symbol is not None else False)
        if bool(finished.all()):
            break
    fill = next(s for s in (pad_symbol, end_symbol, start_symbol) if s is not None)
    ends = ys == end_symbol if end_symbol is not None else torch.zeros_like(ys, dtype=torch.bool)  # (B, L)
    ends[:, 0] = False
    over = (ends.cumsum(1) - ends.long() > 0) | (torch.arange(ys.size(1), device=device) >= limits.unsqueeze(1))
    return ys.masked_fill(over, fill)  # after each sentence's end or limit: the fill symbol
