"""The notebook's greedy decoder, batched: the whole prefix re-run at every step, no cache. The reference that
`decoding.greedy_decode` (cached, finished rows dropped) must match, and the benchmark's baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from ..decoding import length_limits
from ..model import EncoderDecoder, subsequent_mask


@torch.no_grad()
def greedy_decode_naive(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                        start_symbol: int, end_symbol: int | None = None,
                        pad_symbol: int | None = None) -> Tensor:
    """The naive decoder: re-run the decoder over the whole prefix at every step (the notebook's way), batched.

    Same contract and same output as `greedy_decode`; used to check the cache.
    """
    B, device = src.size(0), src.device
    limits = length_limits(max_len, B, device)
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
