"""Decoding many sentences: greedy or beam search on a batch (`decode_batch`), and id sequences of any number
decoded in length-sorted batches (`translate_ids`), as training's BLEU, the Translator and the charts do; on fixed
shapes (static.py) for a compiled or captured step."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .beam_search import Hypotheses, beam_search, beam_search_n_best, length_penalty
from .incremental import greedy_search, longest_target
from .static import Step, static_greedy_search, static_rows
from ..fast.plan import speed_up_decoding
from ..data.buckets import pad_rows, width_ladder
from ..runtime.precision import amp_context
from ..decoding import length_limits
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


def decode_n_best(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor, start_symbol: int,
                  end_symbol: int, beam_size: int, alpha: float, n_best: int,
                  pad_symbol: int | None = None) -> list[Hypotheses]:
    """Each sentence's `n_best` (at most beam_size) hypotheses with their scores, best first: (ids, sum log p(Y) /
    lp(|Y|)) as `beam_search_n_best` gives them; for beam_size 1 greedy search's one, scored alike (as beam search
    with one beam, which it equals, scores it)."""
    if beam_size == 1 and n_best == 1:
        out, sums = greedy_search(model, src, src_mask, max_len, start_symbol, end_symbol, pad_symbol,
                                  return_scores=True)
        rows, limits = out.tolist(), length_limits(max_len, out.size(0), out.device).tolist()
        # |Y|: the tokens up to and including the end symbol, or limit - 1 for a sentence cut at its limit.
        lengths = [min(row.index(end_symbol, 1) if end_symbol in row[1:] else limit, limit - 1)
                   for row, limit in zip(rows, limits)]
        scores = sums / length_penalty(torch.tensor(lengths, device=sums.device), alpha)
        return [[(ids, score)] for ids, score in zip(rows, scores.tolist())]
    return beam_search_n_best(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha, n_best)


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
                  attention_kernel: str = "auto", fast: bool = True,
                  static: Step | None = None, n_best: int | None = None) -> list[list[int]] | list[Hypotheses]:
    """Decode id sequences (each <s> ... </s>) in length-sorted batches; return output ids in input order.

    Each output starts after <s> and stops before </s> (both removed). The longest output of a
    sentence is its source length + `max_len_a` tokens, capped by the positional table. With a
    `static` step (static.py), greedy search runs on fixed shapes: a batch's rows padded to a power of two
    (filler rows decode nothing), its source length rounded up the static width ladder and its output
    length following from that width. With `n_best`, each result is instead the sentence's n best
    (ids, score) pairs, best first (`decode_n_best`). The decoding speed plan (`fast.speed_up_decoding`: the
    fused attention kernel as `attention_kernel` says, oneDNN's linears on the CPU) is on while it runs, unless
    `fast=False`.
    """
    if static is not None and (beam_size > 1 or n_best or getattr(model, "step_mask", None) is not None):
        static = None  # beam search, n-best lists and local attention's band decode on the shapes they meet
    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list = [[] for _ in sources]
    cap = longest_target(model)
    with speed_up_decoding(model, device, fast=fast, attention_kernel=attention_kernel):
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
                elif n_best:
                    found = decode_n_best(model, src, padding_mask(src, pad), max_len, bos, eos, beam_size, alpha,
                                          n_best, pad)
                else:
                    out = decode_batch(model, src, padding_mask(src, pad), max_len, bos, eos,
                                       beam_size=beam_size, alpha=alpha, pad_symbol=pad)
            if n_best:
                for row, hypotheses in enumerate(found):
                    results[idx[row]] = [(strip_special(ids, bos, eos, pad), score) for ids, score in hypotheses]
            else:
                for row, i in enumerate(out[: len(idx)].tolist()):
                    results[idx[row]] = strip_special(i, bos, eos, pad)
    model.train(was_training)
    return results
