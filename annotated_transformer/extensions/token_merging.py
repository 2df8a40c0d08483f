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

Token pruning (token_merging.prune_ratio) shares the machinery: instead of merging, the r real tokens that
receive the least attention in that layer (averaged over heads, summed over queries) leave the
sequence (Kim et al. 2021 learn a threshold per layer; here r is a fixed ratio, like merging's).
The pruning layers compute explicit attention to have the probabilities.

`TokenMergingModel` is the paper's `EncoderDecoder` on the same weights, with an encoder pass that
merges; it reads each merging layer's keys (or probabilities) through an attention hook.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import MultiHeadedAttention
from ..model import EncoderDecoder
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, param

MODES = ("merge", "prune")


@dataclass
class TokenMergingConfig:
    """Token merging and token pruning in the encoder (extensions/token_merging.py); off by default."""

    merge_ratio: float = param(0.0, "token merging (ToMe): after the self-attention of each chosen encoder layer, "
                               "merge this fraction of each sentence's tokens (at most half) into their most similar "
                               "neighbours (0: off)")
    prune_ratio: float = param(0.0, "token pruning: after the self-attention of each chosen encoder layer, drop this "
                               "fraction of each sentence's tokens (at most half), those that receive the least "
                               "attention (0: off; not with merge_ratio)")
    layers: list[int] = param([], "the encoder layers that merge or prune, from 0 (empty: all)")
    proportional_attention: bool = param(True, "token merging: later attention adds log(size) to a merged token's "
                                         "logits, so it weighs as much as the tokens it replaced")


class SeenByAttention:
    """An attention hook: the latest keys, or (for pruning) the latest probabilities, of one attention layer."""

    def __init__(self, probs: bool) -> None:
        self.want_probs = probs
        self.keys: Tensor | None = None  # (B, h, S, d_k)
        self.probs: Tensor | None = None  # (B, h, S, S), detached

    def needs_probs(self, attn: MultiHeadedAttention) -> bool:
        """Pruning ranks tokens by the attention they receive, so it needs the probabilities."""
        return self.want_probs

    def __call__(self, attn: MultiHeadedAttention, keys: Tensor, probs: Tensor | None) -> None:
        self.keys = keys
        self.probs = probs.detach() if probs is not None else None


class TokenMerger:
    """One encoder pass's merging state: token sizes, the attention mask, and where each source token went."""

    def __init__(self, src_mask: Tensor, ratio: float, mode: str = "merge", proportional: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"token merging mode must be one of {MODES}, got {mode!r}")
        self.ratio, self.mode, self.proportional = ratio, mode, proportional  # ratio: of each sentence's tokens
        self.size = src_mask[:, 0].float()  # (B, S) 1 for a real token, 0 for padding
        self.mask: Tensor = src_mask  # (B, 1, S) bool; after a merge: the log-size bias or the survivors
        S = self.size.size(1)
        real = self.size > 0
        # (B, S) each source token's position now; -1: padding, or pruned
        self.slot = torch.where(real, torch.arange(S, device=real.device), -1)
        self.history: list[Tensor] = []  # the slots after each merging layer, in order (merged_groups_by_layer)

    def __call__(self, x: Tensor, seen: SeenByAttention) -> Tensor:
        """x (B, S, d) after a layer's self-attention, `seen` its keys or probabilities -> (B, S', d)."""
        x = self._reduce(x, seen)
        self.history.append(self.slot)
        return x

    def _reduce(self, x: Tensor, seen: SeenByAttention) -> Tensor:
        """Merge or prune one layer's tokens."""
        if x.size(1) < 2:
            return x
        if self.mode == "prune":
            drop = self.least_attended(seen.probs)  # (B, S)
            moved_to = torch.arange(x.size(1), device=x.device).expand_as(drop)  # nothing moves; dropped tokens leave
            return self._compact(x.float() * self.size.unsqueeze(-1), self.size * ~drop, moved_to, x.dtype)
        B, S, d = x.shape
        merge, partner = self.match(seen.keys)  # (B, Na) which A tokens merge, and into which B token
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
        # stable: a tie goes to the earlier token, so a sentence prunes alike alone or padded in any batch
        rank = received.argsort(dim=-1, stable=True).argsort(-1)  # (B, S) 0 = the least attended
        return (rank < self._per_sentence().unsqueeze(1)) & real

    def match(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """Bipartite soft matching: (B, Na) bool 'this A token merges' and (B, Na) its partner in B."""
        metric = F.normalize(keys.float().mean(1), dim=-1)  # (B, S, d_k) keys averaged over heads
        a, b = metric[:, 0::2], metric[:, 1::2]  # (B, Na, d_k), (B, Nb, d_k)
        sim = a @ b.transpose(1, 2)  # (B, Na, Nb) cosine similarity
        sim = sim.masked_fill(self.size[:, 0::2].unsqueeze(2) == 0, float("-inf"))
        sim = sim.masked_fill(self.size[:, 1::2].unsqueeze(1) == 0, float("-inf"))
        best, partner = sim.max(-1)  # (B, Na)
        # stable: a tie goes to the earlier pair, so a sentence merges alike alone or padded in any batch
        rank = best.argsort(dim=-1, descending=True, stable=True).argsort(-1)  # (B, Na) 0 = the most similar pair
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


class TokenMergingModel(EncoderDecoder):
    """An EncoderDecoder that merges (or prunes) source tokens in its encoder; the same parameters as `model`.

    `encode_memory` (what training and the decoders call) returns the shorter memory and the mask the
    decoder reads it with; `encode` keeps the paper's pass, every token kept.
    """

    def __init__(self, model: EncoderDecoder, ratio: float, mode: str = "merge", layers: tuple[int, ...] = (),
                 proportional: bool = True) -> None:
        super().__init__(model.encoder, model.decoder, model.src_embed, model.tgt_embed, model.generator)
        self.ratio, self.mode, self.proportional = ratio, mode, proportional
        self.layers = sorted(set(layers) or range(len(self.encoder.layers)))  # the merging layers
        self.seen = {i: SeenByAttention(probs=mode == "prune") for i in self.layers}
        for i, hook in self.seen.items():
            self.encoder.layers[i].self_attn.hooks.append(hook)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """`EncoderDecoder.forward` on the merged memory."""
        memory, memory_mask = self.encode_memory(src, src_mask)  # (B, S', d), (B, 1, S')
        return self.decode(memory, memory_mask, tgt, tgt_mask)

    def encode_memory(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> the merged memory (B, S', d) and its mask (B, 1, S'): log sizes, or the survivors."""
        merger = TokenMerger(src_mask, self.ratio, self.mode, self.proportional)
        return self.encode_merging(src, merger), merger.mask

    def encode_merging(self, src: Tensor, merger: TokenMerger) -> Tensor:
        """The encoder pass with `merger` applied after the self-attention of each merging layer."""
        x, mask = self.src_embed(src), merger.mask  # (B, S, d), (B, 1, S)
        for i, layer in enumerate(self.encoder.layers):
            if i not in self.seen:
                x = layer(x, mask)
                continue
            x = layer.sublayer[0](x, lambda x, attn=layer.self_attn, mask=mask: attn(x, x, x, mask))
            x = merger(x, self.seen[i])  # (B, S', d): fewer tokens
            mask = merger.mask  # (B, 1, S')
            x = layer.sublayer[1](x, layer.feed_forward)
        return self.encoder.norm(x)

    def plain(self) -> EncoderDecoder:
        """The model without merging (its hooks removed): the paper's EncoderDecoder on the same parameters."""
        for i, hook in self.seen.items():
            self.encoder.layers[i].self_attn.hooks.remove(hook)
        self.seen = {}
        return EncoderDecoder(self.encoder, self.decoder, self.src_embed, self.tgt_embed, self.generator)


def with_token_merging(model: EncoderDecoder, merge_ratio: float = 0.0, prune_ratio: float = 0.0,
                       layers: tuple[int, ...] = (), proportional: bool = True) -> EncoderDecoder:
    """`model` merging `merge_ratio` or pruning `prune_ratio` of the tokens in `layers` (both 0: `model` itself).

    A model that already merges is first made plain, so this also changes or removes merging."""
    if isinstance(model, TokenMergingModel):
        model = model.plain()
    if merge_ratio and prune_ratio:
        raise ValueError("merge_ratio and prune_ratio are both set: use one of them")
    if not (merge_ratio or prune_ratio):
        return model
    mode = "prune" if prune_ratio else "merge"
    return TokenMergingModel(model, merge_ratio or prune_ratio, mode, tuple(layers), proportional)


def merged_groups(model: EncoderDecoder, src_ids: list[int], ratio: float, layers: tuple[int, ...] = (),
                  mode: str = "merge") -> list[list[int]]:
    """Which source positions end up as one token when `model` merges `ratio` of them in `layers` (all when
    empty): one list of positions per surviving token, in order. Pruned tokens are in no list."""
    return merged_groups_by_layer(model, src_ids, ratio, layers, mode)[-1]


@torch.no_grad()
def merged_groups_by_layer(model: EncoderDecoder, src_ids: list[int], ratio: float, layers: tuple[int, ...] = (),
                           mode: str = "merge") -> list[list[list[int]]]:
    """`merged_groups` after each merging layer in turn (one encoder pass), the first merging layer first.
    `model` itself is left as it was."""
    proportional = model.proportional if isinstance(model, TokenMergingModel) else True
    merging = TokenMergingModel(model, ratio, mode, layers, proportional)
    try:
        src = torch.tensor([src_ids], device=next(model.parameters()).device)  # (1, S)
        merger = TokenMerger(torch.ones_like(src, dtype=torch.bool).unsqueeze(1), ratio, mode, proportional)
        merging.encode_merging(src, merger)
    finally:
        merging.plain()
    return [_groups(slot[0].tolist()) for slot in merger.history]


def _groups(slots: list[int]) -> list[list[int]]:
    """Source positions grouped by the token they are now part of, in order (-1, pruned or padding: none)."""
    groups: dict[int, list[int]] = {}
    for position, slot in enumerate(slots):
        if slot >= 0:
            groups.setdefault(slot, []).append(position)
    return [groups[slot] for slot in sorted(groups)]


def validate(cfg: CoreConfig) -> None:
    """The token_merging section's rules, and what they need from the model and from local attention."""
    tm, N = cfg.token_merging, cfg.model.N
    ratios = {"token_merging.merge_ratio": tm.merge_ratio, "token_merging.prune_ratio": tm.prune_ratio}
    for key, ratio in ratios.items():
        if not 0.0 <= ratio <= 0.5:
            raise ConfigError(f"{key} must be in [0, 0.5] (at most half the tokens leave), got {ratio}")
    if tm.merge_ratio and tm.prune_ratio:
        raise ConfigError("token_merging.merge_ratio and token_merging.prune_ratio are both on: use one of them")
    if any(not 0 <= i < N for i in tm.layers):
        raise ConfigError(f"token_merging.layers {tm.layers} names a layer outside the encoder's 0..{N - 1}")
    if (tm.merge_ratio or tm.prune_ratio) and cfg.local_attention.window:
        raise ConfigError("local_attention.window is on with token merging or pruning: a window over fewer tokens "
                          "has no positions to count; use one of them")


def install(cfg: CoreConfig, model: EncoderDecoder) -> EncoderDecoder:
    """`model` merging or pruning as the token_merging section says."""
    tm = cfg.token_merging
    return with_token_merging(model, tm.merge_ratio, tm.prune_ratio, tuple(tm.layers), tm.proportional_attention)


EXTENSION = Extension(
    name="token_merging", section=TokenMergingConfig, help="token merging or pruning", order=20, kind="model",
    on=lambda section: bool(section.merge_ratio or section.prune_ratio), install=install, validate=validate,
    arms={"token merging r=0.25": ("token_merging.merge_ratio=0.25",),
          "token merging r=0.5": ("token_merging.merge_ratio=0.5",),
          "token pruning r=0.25": ("token_merging.prune_ratio=0.25",)},
)
