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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class TokenMerger:
    """One encoder pass's merging state: token sizes, the attention mask, and where each source token went."""

    def __init__(self, src_mask: Tensor, ratio: float, layers: set[int], proportional: bool = True) -> None:
        self.ratio, self.layers, self.proportional = ratio, layers, proportional
        self.size = src_mask[:, 0].float()  # (B, S) 1 for a real token, 0 for padding
        self.mask: Tensor = src_mask  # (B, 1, S) bool; after a merge: the log-size bias or the survivors
        S = self.size.size(1)
        real = self.size > 0
        self.slot = torch.where(real, torch.arange(S, device=real.device), -1)  # (B, S) each source token's position now

    def __call__(self, x: Tensor, keys: Tensor) -> Tensor:
        """x (B, S, d) after a layer's self-attention, keys (B, h, S, d_k) of that attention -> (B, S', d)."""
        B, S, d = x.shape
        dtype = x.dtype
        if S < 2:
            return x
        merge, partner = self.match(keys)  # (B, Na) which A tokens merge, and into which B token
        dst = 2 * partner + 1  # (B, Na) the partner's position in x
        w = self.size[:, 0::2] * merge  # (B, Na) sizes moved
        xs = x.float() * self.size.unsqueeze(-1)  # (B, S, d) size-weighted sums
        xs = xs.scatter_add(1, dst.unsqueeze(-1).expand(-1, -1, d), xs[:, 0::2] * merge.unsqueeze(-1))
        size = self.size.scatter_add(1, dst, w)
        size[:, 0::2] = size[:, 0::2] * ~merge  # the merged A tokens are gone
        moved_to = torch.arange(S, device=x.device).expand(B, S).clone()  # (B, S) where each position's content is now
        moved_to[:, 0::2] = torch.where(merge, dst, moved_to[:, 0::2])
        keep = size > 0  # (B, S)
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # survivors first, in order
        L = int(keep.sum(1).max())
        order = order[:, :L]  # (B, L)
        new_index = self._inverse(order, S)  # (B, S) old position -> new index
        self.slot = torch.where(self.slot >= 0, new_index.gather(1, moved_to.gather(1, self.slot.clamp(min=0))), -1)
        self.size = size.gather(1, order)  # (B, L)
        x = (xs / size.clamp(min=1e-6).unsqueeze(-1)).gather(1, order.unsqueeze(-1).expand(-1, -1, d))
        self.mask = self.attention_mask()
        return x.to(dtype)

    def match(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Bipartite soft matching: (B, Na) bool 'this A token merges' and (B, Na) its partner in B."""
        metric = F.normalize(keys.float().mean(1), dim=-1)  # (B, S, d_k) keys averaged over heads
        a, b = metric[:, 0::2], metric[:, 1::2]  # (B, Na, d_k), (B, Nb, d_k)
        sim = a @ b.transpose(1, 2)  # (B, Na, Nb) cosine similarity
        sim = sim.masked_fill(self.size[:, 0::2].unsqueeze(2) == 0, float("-inf"))
        sim = sim.masked_fill(self.size[:, 1::2].unsqueeze(1) == 0, float("-inf"))
        best, partner = sim.max(-1)  # (B, Na)
        n = (self.size > 0).sum(1)  # (B,) tokens now
        r = torch.minimum((self.ratio * n).floor().long(), n // 2)  # (B,) merges per sentence
        rank = best.argsort(-1, descending=True).argsort(-1)  # (B, Na) 0 = the most similar pair
        return (rank < r.unsqueeze(1)) & (best > float("-inf")), partner

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


@torch.no_grad()
def merged_groups(model, src_ids: list[int], ratio: float, layers: tuple[int, ...] = ()) -> list[list[int]]:
    """Which source positions end up as one token when `model` (an EncoderDecoder) merges `ratio` of them
    in `layers` (all when empty): one list of positions per surviving token, in order. The model's own
    merging setting is left as it was."""
    saved = (model.merge_ratio, model.merge_layers, model.proportional_attention)
    model.set_token_merging(ratio, layers, model.proportional_attention)
    try:
        src = torch.tensor([src_ids], device=next(model.parameters()).device)  # (1, S)
        merger = model.merger(torch.ones_like(src, dtype=torch.bool).unsqueeze(1))  # (1, 1, S) mask
        model.encoder(model.src_embed(src), merger.mask, merger)
    finally:
        model.set_token_merging(*saved)
    groups: dict[int, list[int]] = {}
    for position, slot in enumerate(merger.slot[0].tolist()):
        groups.setdefault(slot, []).append(position)
    return [groups[slot] for slot in sorted(groups)]
