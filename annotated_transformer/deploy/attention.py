"""A sentence's attention: every map of every layer and head, with the tokens that label them (`Translator.attention`).

    from annotated_transformer import Translator, visualization as viz
    tr = Translator.load("runs/cpu_15min")
    sa = tr.attention("Ein Mann fährt Fahrrad.")   # SentenceAttention: the translation, its tokens, every map
    sa.attention["src"][-1]                        # the last layer's encoder-decoder attention, (h, T, S)
    viz.sentence_grid(sa, -1, "src")               # drawn (annotated_transformer.visualization)

The maps come from one teacher-forced pass over (source, <s> + translation), not from the decoding
itself: cached decoding runs the decoder one position at a time, so its last `.attn` holds only the
final step's row. Nothing here draws: the charts are in visualization/, which loads altair.

Conventions: layer arguments are 0-based Python indices (a negative one counts from the end); chart
titles and the layer numbers a user types count from 1, as the paper and the notebook do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from ..extensions.token_merging import TokenMergingModel, merged_groups_by_layer
from ..model import EncoderDecoder, MultiHeadedAttention, subsequent_mask

AttentionKind = Literal["encoder", "self", "src"]


class KindInfo(NamedTuple):
    """How one kind of attention is named and which tokens label its rows (queries) and columns (keys)."""

    title: str  # chart title
    file: str  # file-name part, e.g. attention_layer1_encoder_self.html
    queries: Literal["src", "tgt"]
    keys: Literal["src", "tgt"]


KINDS: dict[str, KindInfo] = {
    "encoder": KindInfo("Encoder self-attention", "encoder_self", "src", "src"),
    "self": KindInfo("Decoder self-attention", "decoder_self", "tgt", "tgt"),
    "src": KindInfo("Decoder-source attention", "decoder_src", "tgt", "src"),
}
ATTENTION_KINDS: tuple[str, ...] = tuple(KINDS)

SPM_SPACE = "\u2581"  # SentencePiece's word-start marker


def kind_info(kind: str) -> KindInfo:
    """The naming of `kind`, or a ValueError that lists the kinds there are."""
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}")
    return KINDS[kind]


def layer_index(layer: int, n_layers: int, first: int = 0) -> int:
    """The 0-based index of `layer`, counted from `first`, or a ValueError naming the valid range.

    first=0: a Python index (a negative one counts from the end); first=1: a layer number as the
    chart titles print it.
    """
    lowest = -n_layers if first == 0 else first
    if not lowest <= layer < n_layers + first:
        raise ValueError(f"layer {layer} does not exist: the model has {n_layers} layer{'s' if n_layers > 1 else ''}, "
                         f"numbered {first} to {n_layers - 1 + first}")
    return (layer - first) % n_layers


# --------------------------------------------------------------------------- keeping the maps


class _KeepProbs:
    """An attention hook that stores each call's probabilities in the layer's `.attn`, as the notebook's layers do."""

    def needs_probs(self, attn: MultiHeadedAttention) -> bool:
        """Always: the maps are the probabilities."""
        return True

    def __call__(self, attn: MultiHeadedAttention, keys: Tensor, probs: Tensor | None) -> None:
        attn.attn = probs.detach()  # (B, h, T, S)


@contextmanager
def keep_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Within this block every attention layer of `model` keeps its latest probabilities in `.attn` (B, h, T, S)."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    hook = _KeepProbs()
    for m in modules:
        m.hooks.append(hook)
    try:
        yield model
    finally:
        for m in modules:
            m.hooks.remove(hook)


def attention_modules(model: EncoderDecoder, kind: str) -> list[MultiHeadedAttention]:
    """The attention sublayers of one kind, one per layer."""
    kind_info(kind)
    if kind == "encoder":
        return [layer.self_attn for layer in model.encoder.layers]
    if kind == "self":
        return [layer.self_attn for layer in model.decoder.layers]
    return [layer.src_attn for layer in model.decoder.layers]


@torch.no_grad()
def collect_attention(model: EncoderDecoder, src: Tensor, src_mask: Tensor | None,
                      tgt_ids: Tensor) -> dict[str, list[Tensor]]:
    """Encode one sentence and decode `tgt_ids` (teacher-forced) inside `keep_attention`.

    src (S,) or (1, S) source ids; src_mask (1, 1, S) or None (nothing masked); tgt_ids (T,)
    or (1, T), the decoder's input (normally <s> followed by the translation).
    Returns {"encoder": [(h, S, S)] * N, "self": [(h, T, T)] * N, "src": [(h, T, S)] * N} on the
    CPU. The maps also stay in each module's `.attn` for `visualization.attention_grid`.

    Runs in eval mode (dropout would otherwise perturb the stored probabilities) and restores
    the model's mode afterwards.
    """
    device = next(model.parameters()).device
    src = src.reshape(1, -1).to(device)  # (1, S)
    tgt = tgt_ids.reshape(1, -1).to(device)  # (1, T)
    if src_mask is None:
        src_mask = torch.ones(1, 1, src.size(1), dtype=torch.bool, device=device)
    src_mask = src_mask.reshape(1, 1, -1).to(device)  # (1, 1, S)
    was_training = model.training
    model.eval()
    try:
        with keep_attention(model):
            memory, memory_mask = model.encode_memory(src, src_mask)
            model.decode(memory, memory_mask, tgt, subsequent_mask(tgt.size(1), device=device))
    finally:
        model.train(was_training)
    return {kind: [m.attn[0].cpu() for m in attention_modules(model, kind)] for kind in ATTENTION_KINDS}


# --------------------------------------------------------------------------- one sentence


@dataclass
class SentenceAttention:
    """One sentence, its translation, and every attention map of the teacher-forced pass over both.

    src_ids are the encoder's input (<s> ... </s>); tgt_ids the decoder's input (<s> + the
    translation, no </s>: the last position is the one that predicted </s>). The token lists
    label the same positions for display (an unknown word as "word (unk)", SentencePiece's word
    marker dropped). attention: {"encoder": [(h, S, S)] * N, "self": [(h, T, T)] * N,
    "src": [(h, T, S)] * N}, one (heads, queries, keys) tensor a layer, each row summing to 1.
    With token merging or pruning, the encoder's later layers and the encoder-decoder attention
    see fewer source positions: `labels` gives each map's own.
    """

    sentence: str
    translation: str
    src_ids: list[int]
    tgt_ids: list[int]
    src_tokens: list[str]
    tgt_tokens: list[str]
    attention: dict[str, list[Tensor]] = field(repr=False)
    truncated: bool = False  # the sentence was longer than the model's limit and was cut (src_ids: what it saw)
    layer_src_tokens: list[list[str]] | None = None  # token merging/pruning: each encoder layer's source labels
    memory_tokens: list[str] | None = None  # ... and the memory's, which encoder-decoder attention reads

    @property
    def n_layers(self) -> int:
        """Encoder (= decoder) layers of the model."""
        return len(self.attention["encoder"])

    def labels(self, layer: int, kind: AttentionKind) -> tuple[list[str], list[str]]:
        """The tokens that label the rows (queries) and columns (keys) of `attention[kind][layer]`."""
        info = kind_info(kind)
        src_tokens = self.src_tokens
        if kind == "encoder" and self.layer_src_tokens is not None:
            src_tokens = self.layer_src_tokens[layer_index(layer, self.n_layers)]
        elif kind == "src" and self.memory_tokens is not None:
            src_tokens = self.memory_tokens
        tokens = {"src": src_tokens, "tgt": self.tgt_tokens}
        return tokens[info.queries], tokens[info.keys]


def display_token(token: str) -> str:
    """A token as a chart label: SentencePiece's word-start marker removed (a lone marker is kept)."""
    return token.replace(SPM_SPACE, "") or token


def merged_source_tokens(model: EncoderDecoder, src_ids: list[int],
                         tokens: list[str]) -> tuple[list[list[str]], list[str]] | tuple[None, None]:
    """With token merging or pruning on: the source labels each encoder layer's maps show (a merged token's
    parts joined by '+', pruned tokens gone) and the memory's; (None, None) when the model keeps every token."""
    if not isinstance(model, TokenMergingModel):
        return None, None
    merging = model.layers
    by_layer = merged_groups_by_layer(model, src_ids, model.ratio, tuple(merging), model.mode)
    labels = [list(tokens)] + [["+".join(tokens[p] for p in group) for group in groups] for groups in by_layer]
    # Layer i's attention runs before its own merge: it sees the tokens left by the merging layers below it.
    per_layer = [labels[sum(m < i for m in merging)] for i in range(len(model.encoder.layers))]
    return per_layer, labels[-1]


def source_labels(text: Any, sentence: str, ids: list[int]) -> list[str]:
    """A label per source id of `text` (a TextPipeline): the vocabulary's token, or, for an unknown word, the word
    as typed."""
    labels = text.vocab("src").lookup_tokens(ids)
    if text.mode == "word":
        # ids = <s>, one id per word (cut to max_sentence_len with </s> kept), </s>: word k sits at position k + 1.
        words = text.tokenize(sentence, "src")
        for pos, word in enumerate(words[: len(ids) - 2], start=1):
            if ids[pos] == text.unk_id:
                labels[pos] = f"{word} (unk)"  # the model saw <unk>; the reader wants the word
    return [display_token(t) for t in labels]


def sentence_attention(model: EncoderDecoder, text: Any, sentence: str, src_ids: list[int], out_ids: list[int],
                       truncated: bool = False) -> SentenceAttention:
    """Every attention map of `model` reading `sentence` (its ids `src_ids`, <s> ... </s>) and its translation
    `out_ids` (without <s> and </s>), labelled with the tokens of `text` (the TextPipeline)."""
    tgt_ids = [text.bos_id, *out_ids]
    # lookup_tokens maps every id, so the labels stay aligned with the positions even if the
    # output holds an id that decode_tokens would drop.
    tgt_tokens = ["<s>", *(display_token(t) for t in text.vocab("tgt").lookup_tokens(out_ids))]
    attention = collect_attention(model, torch.tensor(src_ids), None, torch.tensor(tgt_ids))
    src_tokens = source_labels(text, sentence, src_ids)
    layer_src_tokens, memory_tokens = merged_source_tokens(model, src_ids, src_tokens)
    return SentenceAttention(sentence=sentence, translation=text.ids_to_text(out_ids, "tgt"), src_ids=src_ids,
                             tgt_ids=tgt_ids, src_tokens=src_tokens, tgt_tokens=tgt_tokens, attention=attention,
                             truncated=truncated, layer_src_tokens=layer_src_tokens, memory_tokens=memory_tokens)
