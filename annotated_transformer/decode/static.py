"""Greedy search on fixed shapes, so that a GPU compiles or captures its decoder step once per shape.

`greedy_search` (incremental.py) drops finished sentences and grows each self-attention cache by
one position a step: new shapes at every step, which eager decoding does not mind and CUDA graphs
do. Here the batch keeps its rows to the end, each self-attention writes into key/value buffers
allocated once for the longest output, and a step reads the whole buffer through a mask of the
positions written so far. The position is a device tensor, so one graph serves every position of a
(rows, source width, output length) shape; `translate_ids` pads batches to a few such shapes. Same
tokens as `greedy_search`, whose search this is (tests/test_static_decoding.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor, nn

from ..attention import MultiHeadedAttention
from ..decoding import length_limits
from ..model import EncoderDecoder

# (model, memory mask, newest tokens (B, 1), their position (0-dim), cache) -> next-token logits (B, V)
Step = Callable[[EncoderDecoder, Tensor, Tensor, Tensor, "StaticCache"], Tensor]


@dataclass
class StaticCache:
    """Every decoder layer's keys and values, allocated once: self-attention's (B, h, L, d_k) buffers, written one
    position a step, and encoder-decoder attention's projected memory (B, h, S, d_k)."""

    self_k: list[Tensor]
    self_v: list[Tensor]
    src_k: list[Tensor]
    src_v: list[Tensor]

    @classmethod
    def start(cls, model: EncoderDecoder, memory: Tensor, length: int) -> StaticCache:
        """The cache of a search: the memory projected by each layer's W^K and W^V, in buffers for `length` target
        positions. On CUDA they are kept per model and shape, so that a captured step reads and writes the same
        addresses every batch (marked static: a graph neither copies them nor refuses their writes); on the CPU
        nothing needs that, and a search's buffers go with it (kept, every shape's came to hundreds of MB)."""
        heads = [(layer.src_attn._heads(memory, layer.src_attn.linears[1]),
                  layer.src_attn._heads(memory, layer.src_attn.linears[2])) for layer in model.decoder.layers]
        B, h, S, d_k = heads[0][0].shape
        kept = _KEPT.setdefault(model, {}) if memory.is_cuda else {}
        key = (B, S, length, heads[0][0].dtype, memory.device)
        if key not in kept:
            empty = [heads[0][0].new_zeros(B, h, length, d_k) for _ in range(2 * len(heads))]  # autocast's dtype
            kept[key] = cls(empty[0::2], empty[1::2], [k.clone() for k, _ in heads], [v.clone() for _, v in heads])
            if memory.is_cuda:
                for buffer in (*kept[key].self_k, *kept[key].self_v, *kept[key].src_k, *kept[key].src_v):
                    torch._dynamo.mark_static_address(buffer)
        cache = kept[key]
        for (k, v), mk, mv in zip(heads, cache.src_k, cache.src_v):
            mk.copy_(k)
            mv.copy_(v)
        return cache  # positions past the search's are masked: the self-attention buffers need no clearing


# The caches of static searches, per model (dropped with it) and per shape.
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[tuple, StaticCache]] = weakref.WeakKeyDictionary()


def _self_attention(attn: MultiHeadedAttention, x: Tensor, pos: Tensor, seen: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """x (B, 1, d) at position `pos`: its keys/values written into k, v (B, h, L, d_k), then attention over `seen`."""
    k.index_copy_(2, pos.view(1), attn._heads(x, attn.linears[1]))
    v.index_copy_(2, pos.view(1), attn._heads(x, attn.linears[2]))
    return attn.attend(x, k, v, seen)  # (B, 1, d)


def static_step(model: EncoderDecoder, memory_mask: Tensor, token: Tensor, pos: Tensor, cache: StaticCache) -> Tensor:
    """The next token's logits (B, V) after `token` (B, 1) at position `pos`, its keys/values kept in `cache`."""
    embed, position = model.tgt_embed  # Embeddings, PositionalEncoding
    x = position.dropout(embed(token) + position.pe.index_select(1, pos.view(1)))  # (B, 1, d)
    L = cache.self_k[0].size(2)
    seen = (torch.arange(L, device=pos.device) <= pos).view(1, 1, L)  # (1, 1, L): the positions written so far
    for i, layer in enumerate(model.decoder.layers):
        k, v, mk, mv = cache.self_k[i], cache.self_v[i], cache.src_k[i], cache.src_v[i]
        x = layer.sublayer[0](x, lambda y: _self_attention(layer.self_attn, y, pos, seen, k, v))
        x = layer.sublayer[1](x, lambda y: layer.src_attn.attend(y, mk, mv, memory_mask))
        x = layer.sublayer[2](x, layer.feed_forward)
    return model.generator.logits(model.decoder.norm(x)[:, -1])  # (B, V)


@cache
def compiled_step(mode: str | None) -> Step:
    """`static_step` compiled once per process: mode 'reduce-overhead' captures each shape as CUDA graphs; None is
    torch.compile's default. After its second shape torch.compile makes the shapes symbolic, so more shapes than its
    recompile limit never send a search back to eager."""
    return torch.compile(static_step, mode=mode, fullgraph=True)


def validation_step(compile: bool | str, device: torch.device) -> Step | None:
    """The step that validation decodes with on static shapes, compiled as train.compile says (captured: CUDA
    graphs). Not compiled: `static_step` on the CPU, and None on a GPU, where the search on the shapes it meets
    is faster. On the CPU the search that drops finished sentences meets a new shape at nearly every step, and
    oneDNN keeps a compiled kernel (about half a MB) for each: hundreds of MB a validation, more as the model
    changes, where the fixed shapes take a few dozen kernels for about a third more time."""
    if compile is False:
        return static_step if device.type == "cpu" else None
    return compiled_step("reduce-overhead" if compile == "captured" else None)


def static_rows(n: int, batch_size: int) -> int:
    """The rows a batch of `n` sentences is padded to: the next power of two, at most `batch_size` (a few shapes, and
    a short last batch not padded to a full one)."""
    return min(batch_size, 2 ** math.ceil(math.log2(max(n, 1))))


@torch.no_grad()
def static_greedy_search(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: int | Tensor,
                         start_symbol: int, end_symbol: int | None = None, pad_symbol: int | None = None,
                         length: int | None = None, step: Step = static_step) -> Tensor:
    """`greedy_search`'s tokens with every step on one shape: `length` (at least the longest limit) target positions.

    `step` is `static_step` or a compiled one (`compiled_step`). Returns (B, L) ids with L <= max(max_len).
    """
    if getattr(model, "step_mask", None) is not None:
        raise ValueError("static_greedy_search has no step mask for local attention's band: use greedy_search")
    B, device = src.size(0), src.device
    limits = length_limits(max_len, B, device)
    L = int(limits.max())
    fill = next(s for s in (pad_symbol, end_symbol, start_symbol) if s is not None)
    out = torch.full((B, max(L, 1)), fill, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    if L <= 1:
        return out[:, :1]
    memory, memory_mask = model.encode_memory(src, src_mask)  # (B, S, d); merged tokens: (B, S', d) and its mask
    cache = StaticCache.start(model, memory, max(L, length or 0))
    token, pos = out[:, :1].clone(), torch.zeros((), dtype=torch.long, device=device)  # (B, 1), position 0
    finished, t = limits <= 1, 0
    for t in range(1, L):
        token = step(model, memory_mask, token, pos, cache).argmax(dim=-1, keepdim=True)  # (B, 1)
        out[:, t] = token.squeeze(1).masked_fill(finished, fill)
        finished = finished | (limits <= t + 1)
        if end_symbol is not None:
            finished |= token.squeeze(1) == end_symbol
        if bool(finished.all()):
            break
        pos += 1
    return out[:, : t + 1]
