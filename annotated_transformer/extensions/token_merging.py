"""Token merging in the encoder (ToMe, Bolya et al. 2022), with proportional attention.

After the self-attention of chosen encoder layers, the most similar pairs of source tokens are
merged, so later layers, and every decoding step's encoder-decoder attention, see fewer tokens.
Bipartite soft matching: the tokens at even positions (set A) each find their most similar token
at an odd position (set B) by the cosine of their attention keys (averaged over heads); the r
pairs with the highest similarity merge, A into B, as a size-weighted average. A token's size
counts the source tokens it stands for; padding has size 0 and a similarity of minus infinity,
so it never merges with a real token. Merged tokens and padding then leave the sequence (the
survivors move left, in order), which is where the time is saved.

Proportional attention: a merged token's keys get log(size) added to their logits, so it draws
as much attention as the tokens it replaced would have together; log(0) = -inf also masks
padding. r is a ratio of each sentence's real length, at most half of it.

Token pruning (model.prune_ratio) shares the machinery: instead of merging, the r real tokens that
receive the least attention in that layer (averaged over heads, summed over queries) leave the
sequence (Kim et al. 2021 learn a threshold per layer; here r is a fixed ratio, like merging's).
The pruning layers compute explicit attention to have the probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from ..attention import MultiHeadedAttention


class TokenMerger:
    """One encoder pass's merging state: token sizes, the attention mask, and where each source token went."""

    def __init__(self, src_mask: Tensor, ratio: float, layers: set[int], proportional: bool = True,
                 prune: bool = False) -> None:
        self.ratio, self.layers, self.proportional, self.prune = ratio, layers, proportional, prune
        self.size = src_mask[:, 0].float()  # (B, S) 1 for a real token, 0 for padding
        self.mask: Tensor = src_mask  # (B, 1, S) bool; after a merge: the log-size bias or the survivors
        S = self.size.size(1)
        real = self.size > 0
        # (B, S) each source token's position now; -1: padding, or pruned
        self.slot = torch.where(real, torch.arange(S, device=real.device), -1)
        self.history: list[Tensor] = []  # the slots after each merging layer, in order (merged_groups_by_layer)

    def __call__(self, x: Tensor, attn: MultiHeadedAttention) -> Tensor:
        """x (B, S, d) after a layer's self-attention `attn` (its keys or probabilities kept) -> (B, S', d)."""
        x = self._reduce(x, attn)
        self.history.append(self.slot)
        return x

    def _reduce(self, x: Tensor, attn: MultiHeadedAttention) -> Tensor:
        """Merge or prune one layer's tokens."""
        if x.size(1) < 2:
            return x
        if self.prune:
            drop = self.least_attended(attn.attn)  # (B, S)
            moved_to = torch.arange(x.size(1), device=x.device).expand_as(drop)  # nothing moves; dropped tokens leave
            return self._compact(x.float() * self.size.unsqueeze(-1), self.size * ~drop, moved_to, x.dtype)
        B, S, d = x.shape
        merge, partner = self.match(attn.keys)  # (B, Na) which A tokens merge, and into which B token
        dst = 2 * partner + 1  # (B, Na) the partner's position in x
        w = self.size[:, 0::2] * merge  # (B, Na) sizes moved
        xs = x.float() * self.size.unsqueeze(-1)  # (B, S, d) size-weighted sums
        xs = xs.scatter_add(1, dst.unsqueeze(-1).expand(-1, -1, d), xs[:, 0::2] * merge.unsqueeze(-1))
        size = self.size.scatter_add(1, dst, w)
        size[:, 0::2] = size[:, 0::2] * ~merge  # the merged A tokens are gone
        moved_to = torch.arange(S, device=x.device).expand(B, S).clone()  # (B, S) where each position's content is now
        moved_to[:, 0::2] = torch.where(merge, dst, moved_to[:, 0::2])
        return self._compact(xs, size, moved_to, x.dtype)

    def _compact(self, xs: Tensor, size: Tensor, moved_to: Tensor, dtype: torch.dtype) -> Tensor:
        """Size-weighted sums xs (B, S, d) and new sizes (B, S) -> the survivors' averages (B, S', d), in order;
        the sizes, the slots and the mask follow (a slot whose content left without merging becomes -1)."""
        d = xs.size(-1)
        keep = size > 0  # (B, S)
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # survivors first, in order
        order = order[:, :int(keep.sum(1).max())]  # (B, S')
        new_index = self._inverse(order, xs.size(1))  # (B, S) old position -> new index
        now = moved_to.gather(1, self.slot.clamp(min=0))  # (B, S) each source token's position after the merge
        alive = (self.slot >= 0) & keep.gather(1, now)
        self.slot = torch.where(alive, new_index.gather(1, now), -1)
        self.size = size.gather(1, order)  # (B, S')
        x = (xs / size.clamp(min=1e-6).unsqueeze(-1)).gather(1, order.unsqueeze(-1).expand(-1, -1, d))
        self.mask = self.attention_mask()
        return x.to(dtype)

    def least_attended(self, probs: Tensor) -> Tensor:
        """Token pruning by attention received (Kim et al. 2021, with a fixed ratio instead of learned
        thresholds): probs (B, h, S, S) -> (B, S) bool, the real tokens that receive the least attention,
        averaged over heads and summed over real queries; at most `ratio` of them, at most half."""
        real = self.size > 0  # (B, S)
        received = (probs.float().mean(1) * real.unsqueeze(2)).sum(1)  # (B, S) over heads and real queries
        received = received.masked_fill(~real, float("inf"))  # padding leaves anyway; never counted
        rank = received.argsort(-1).argsort(-1)  # (B, S) 0 = the least attended
        return (rank < self._per_sentence().unsqueeze(1)) & real

    def match(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Bipartite soft matching: (B, Na) bool 'this A token merges' and (B, Na) its partner in B."""
        metric = F.normalize(keys.float().mean(1), dim=-1)  # (B, S, d_k) keys averaged over heads
        a, b = metric[:, 0::2], metric[:, 1::2]  # (B, Na, d_k), (B, Nb, d_k)
        sim = a @ b.transpose(1, 2)  # (B, Na, Nb) cosine similarity
        sim = sim.masked_fill(self.size[:, 0::2].unsqueeze(2) == 0, float("-inf"))
        sim = sim.masked_fill(self.size[:, 1::2].unsqueeze(1) == 0, float("-inf"))
        best, partner = sim.max(-1)  # (B, Na)
        rank = best.argsort(-1, descending=True).argsort(-1)  # (B, Na) 0 = the most similar pair
        return (rank < self._per_sentence().unsqueeze(1)) & (best > float("-inf")), partner

    def _per_sentence(self) -> Tensor:
        """(B,) tokens each sentence gives up in this layer: `ratio` of its real tokens now, at most half."""
        n = (self.size > 0).sum(1)  # (B,)
        return torch.minimum((self.ratio * n).floor().long(), n // 2)

    @staticmethod
    def _inverse(order: Tensor, S: int) -> Tensor:
        """(B, L) survivors' old positions -> (B, S) their new index (positions that left get 0; never read)."""
        inv = torch.zeros(order.size(0), S, dtype=torch.long, device=order.device)
        return inv.scatter_(1, order, torch.arange(order.size(1), device=order.device).expand_as(order).contiguous())

    def attention_mask(self) -> Tensor:
        """(B, 1, S') what later attention to these tokens adds: log(size) (proportional), or survivors only."""
        if self.proportional:
            return self.size.log().unsqueeze(1)  # (B, 1, S') float, -inf for padding
        return (self.size > 0).unsqueeze(1)  # (B, 1, S') bool


def merged_groups(model, src_ids: list[int], ratio: float, layers: tuple[int, ...] = (),
                  prune: bool = False) -> list[list[int]]:
    """Which source positions end up as one token when `model` (an EncoderDecoder) merges `ratio` of them
    in `layers` (all when empty): one list of positions per surviving token, in order. With `prune`,
    the tokens dropped are in no list. The model's own merging setting is left as it was."""
    return merged_groups_by_layer(model, src_ids, ratio, layers, prune)[-1]


@torch.no_grad()
def merged_groups_by_layer(model, src_ids: list[int], ratio: float, layers: tuple[int, ...] = (),
                           prune: bool = False) -> list[list[list[int]]]:
    """`merged_groups` after each merging layer in turn (one encoder pass), the first merging layer first."""
    saved = (model.merge_ratio, model.merge_layers, model.proportional_attention, model.prune)
    model.set_token_merging(ratio, layers, model.proportional_attention, prune)
    try:
        src = torch.tensor([src_ids], device=next(model.parameters()).device)  # (1, S)
        merger = model.merger(torch.ones_like(src, dtype=torch.bool).unsqueeze(1))  # (1, 1, S) mask
        model.encoder(model.src_embed(src), merger.mask, merger)
    finally:
        model.set_token_merging(*saved)
    return [_groups(slot[0].tolist()) for slot in merger.history]


def _groups(slots: list[int]) -> list[list[int]]:
    """Source positions grouped by the token they are now part of, in order (-1, pruned or padding: none)."""
    groups: dict[int, list[int]] = {}
    for position, slot in enumerate(slots):
        if slot >= 0:
            groups.setdefault(slot, []).append(position)
    return [groups[slot] for slot in sorted(groups)]
