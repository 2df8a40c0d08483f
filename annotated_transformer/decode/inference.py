"""Decoding many sentences: greedy or beam search on a batch (`decode_batch`), and id sequences of any number
decoded in length-sorted batches (`translate_ids`), as training's BLEU, the Translator and the charts do; on fixed
shapes (static.py) for a compiled or captured step."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .beam_search import beam_search
from .incremental import greedy_search, longest_target
from .static import Step, static_greedy_search, static_rows
from ..fast.cpu_linear import onednn_linears
from ..data.buckets import pad_rows, width_ladder
from ..runtime.device import amp_context
from ..masks import padding_mask
from ..model import EncoderDecoder


def decode_batch(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                 start_symbol: int, end_symbol: int, beam_size: int = 1, alpha: float = 0.6,
                 pad_symbol: int | None = None) -> Tensor:
    """Greedy search for beam_size 1, beam search otherwise; same arguments and output format."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if beam_size == 1:
        return greedy_search(model, src, src_mask, max_len, start_symbol, end_symbol, pad_symbol)
    return beam_search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, pad_symbol)


def strip_special(ids: list[int], start_symbol: int, end_symbol: int | None,
                  pad_symbol: int | None = None) -> list[int]:
    """A decoder's output row as the sentence's ids: the start symbol and everything from the end symbol on dropped."""
    out = ids[1:] if ids and ids[0] == start_symbol else list(ids)
    if end_symbol is not None and end_symbol in out:
        out = out[: out.index(end_symbol)]
    if pad_symbol is not None and pad_symbol != end_symbol:
        out = [i for i in out if i != pad_symbol]
    return out


def translate_ids(model: EncoderDecoder, sources: Sequence[Sequence[int]], *, pad: int, bos: int, eos: int,
                  device: torch.device, beam_size: int = 1, alpha: float = 0.6, max_len_a: int = 50,
                  batch_size: int = 128, amp_dtype: torch.dtype | None = None,
                  static: Step | None = None) -> list[list[int]]:
    """Decode id sequences (each <s> ... </s>) in length-sorted batches; return output ids in input order.

    Each output starts after <s> and stops before </s> (both removed). The longest output of a
    sentence is its source length + `max_len_a` tokens, capped by the positional table. With a
    `static` step (static.py), greedy search runs on fixed shapes: a batch's rows padded to a power of two
    (filler rows decode nothing), its source length rounded up the static width ladder and its output
    length following from that width.
    """
    if static is not None and (beam_size > 1 or getattr(model, "step_mask", None) is not None):
        static = None  # beam search, and local attention's band, decode on the shapes they meet
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    cap = longest_target(model)
    with onednn_linears(model, enabled=None if device.type == "cpu" else False):  # MKL's or oneDNN's fp32 matmuls
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            rows = [sources[i] for i in idx] + [[bos, eos]] * (static_rows(len(idx), batch_size) - len(idx)
                                                               if static else 0)
            width = int(width_ladder(max(map(len, rows)))[-1]) if static else None
            src = pad_rows(rows, pad, width).to(device)  # (B, S)
            max_len = (torch.tensor([len(r) for r in rows]) + max_len_a).clamp(max=cap)
            max_len[len(idx):] = 1  # filler rows: the start symbol alone
            with torch.no_grad(), amp_context(device, amp_dtype):
                if static is not None:
                    length = min(int(width_ladder(width + max_len_a)[-1]), cap)  # one output length a width
                    out = static_greedy_search(model, src, padding_mask(src, pad), max_len, bos, eos, pad,
                                               length=length, step=static)
                else:
                    out = decode_batch(model, src, padding_mask(src, pad), max_len, bos, eos,
                                       beam_size=beam_size, alpha=alpha, pad_symbol=pad)
            for row, i in enumerate(out[: len(idx)].tolist()):
                results[idx[row]] = strip_special(i, bos, eos, pad)
    model.train(was_training)
    return results
