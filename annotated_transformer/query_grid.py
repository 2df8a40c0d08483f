"""How beam search lays out its hypotheses' queries for the encoder-decoder attention (`QueryGrid`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


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
