"""How beam search lays out its hypotheses' queries for the encoder-decoder attention (`QueryGrid`), installed on
the model from outside for the length of a search (`grouped_queries`): MultiHeadedAttention knows nothing of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch import Tensor, nn


@dataclass
class QueryGrid:
    """Beam search's layout for encoder-decoder attention: each hypothesis row's place among its sentence's slots.

    All hypotheses of a sentence read the same memory. So the memory's keys/values are kept once
    per sentence (b rows, not one per hypothesis, and never copied when hypotheses are reordered),
    and the queries are placed in a (b, slots) grid instead: one product with up to `slots` queries
    per sentence replaces `slots` one-query products, each against its own copy of the keys.
    """

    place: Tensor  # (n,) each row's index in the flattened (b * slots) grid
    sentences: int  # b
    slots: int  # k

    def group(self, x: Tensor) -> Tensor:
        """(n, 1, d) rows -> (b, slots, d); an empty slot is zeros (its output is never read)."""
        grid = x.new_zeros(self.sentences * self.slots, x.size(-1))
        grid.index_copy_(0, self.place, x.reshape(-1, x.size(-1)))
        return grid.view(self.sentences, self.slots, -1)

    def ungroup(self, x: Tensor) -> Tensor:
        """(b, slots, d) -> (n, 1, d): the rows back in their own order."""
        return x.reshape(-1, x.size(-1)).index_select(0, self.place).unsqueeze(1)


@dataclass
class QueryLayout:
    """The grid the encoder-decoder attention reads its queries through at the current step (set by the search)."""

    grid: QueryGrid | None = None


class _GroupQueries(nn.Module):
    """W^Q, then each row placed in its sentence's grid: (n, 1, d) -> (b, slots, d)."""

    def __init__(self, linear: nn.Module, layout: QueryLayout) -> None:
        super().__init__()
        self.linear, self.layout = linear, layout

    def forward(self, x: Tensor) -> Tensor:
        return self.layout.grid.group(self.linear(x))


class _UngroupOutputs(nn.Module):
    """The grid's rows back in their own order, then W^O: (b, slots, d) -> (n, 1, d)."""

    def __init__(self, linear: nn.Module, layout: QueryLayout) -> None:
        super().__init__()
        self.linear, self.layout = linear, layout

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.layout.grid.ungroup(x))


@contextmanager
def grouped_queries(model: nn.Module) -> Iterator[QueryLayout]:
    """Inside the block, every decoder layer's encoder-decoder attention groups its queries by `layout.grid`.

    W^Q and W^O of each `src_attn` are wrapped in place and given back on leaving, even after an error;
    the weights are the same objects throughout.
    """
    layout = QueryLayout()
    attns = [layer.src_attn for layer in model.decoder.layers]
    kept = [(a.linears[0], a.linears[3]) for a in attns]
    for a, (w_q, w_o) in zip(attns, kept):
        a.linears[0], a.linears[3] = _GroupQueries(w_q, layout), _UngroupOutputs(w_o, layout)
    try:
        yield layout
    finally:
        for a, (w_q, w_o) in zip(attns, kept):
            a.linears[0], a.linears[3] = w_q, w_o
