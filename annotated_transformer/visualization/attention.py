"""Attention maps of one sentence: translate it, keep every layer's weights, draw each head.

    from annotated_transformer import Translator
    from annotated_transformer.visualization import sentence_attention

    tr = Translator.from_checkpoint("runs/base")             # a run directory, or a model file
    sa = sentence_attention(tr, "Ein Mann fährt Fahrrad.")   # translation, tokens, every attention map
    sa.grid(layer=0, kind="src")                              # one layer's decoder-source heads (a chart)

    collect_attention     one teacher-forced forward pass that keeps every attention map
    attention_chart       one head's (T, S) map, tokens on the axes, weight in the tooltip
    attention_grid        the heads of one layer's encoder / decoder-self / decoder-source attention
    attention_maps_grid   the same, from the maps collect_attention returned
    sentence_attention    a sentence, its translation, its token labels and every map (SentenceAttention)

The maps come from one teacher-forced pass over (source, <s> + translation), not from the decoding
itself: cached decoding runs the decoder one position at a time, so its last `.attn` holds only the
final step's row.

Conventions: layer and head arguments are 0-based Python indices; chart titles count from 1, as the
paper and the notebook do ("layer 1" is `layers[0]`), and so do the layer numbers a user types
(`layer_indices`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import altair as alt
import torch
from torch import Tensor, nn

from ..decode.inference import translate_ids
from ..deploy.translator import Translator
from ..runtime.errors import UserError
from ..extensions.token_merging import TokenMergingModel, merged_groups_by_layer
from ..model import EncoderDecoder, MultiHeadedAttention, subsequent_mask
from .heatmap import CELL_PX, heatmap

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
# A grid row of about this many pixels still reads on a screen; wider grids wrap to fewer columns.
GRID_ROW_PX = 2400


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


def layer_indices(layer_numbers: Sequence[int] | None, n_layers: int) -> list[int]:
    """0-based indices of 1-based layer numbers (the charts' titles, the CLI's --layers); None means every layer."""
    if not layer_numbers:
        return list(range(n_layers))
    try:
        return sorted({layer_index(n, n_layers, first=1) for n in layer_numbers})
    except ValueError as exc:
        raise UserError(str(exc)) from None


# --------------------------------------------------------------------------- one head, one layer


def attention_chart(attn: Tensor, row_tokens: Sequence[str], col_tokens: Sequence[str], title: str,
                    cell_px: int = CELL_PX) -> alt.Chart:
    """One head's attention map: attn (T, S), rows = queries (`row_tokens`), columns = keys (`col_tokens`).

    Tokens appear on the axes in sentence order; the tooltip gives both tokens and the weight.
    """
    attn = torch.as_tensor(attn).detach().float().cpu()
    if attn.dim() != 2 or attn.shape != (len(row_tokens), len(col_tokens)):
        raise ValueError(f"attention of shape {tuple(attn.shape)} does not match {len(row_tokens)} query "
                         f"tokens x {len(col_tokens)} key tokens")
    weights = attn.tolist()
    # 6 decimals: a row of 50 weights still sums to 1 within 3e-5, and the data stays small.
    rows = [{"row": i, "col": j, "query": str(q), "key": str(k), "weight": round(weights[i][j], 6)}
            for i, q in enumerate(row_tokens) for j, k in enumerate(col_tokens)]
    return heatmap(
        rows, row_tokens, col_tokens, title=title,
        row_title="query", col_title="key",
        color=alt.Color("weight:Q", title="weight", scale=alt.Scale(scheme="viridis")),
        tooltip=[alt.Tooltip("query:N"), alt.Tooltip("row:O", title="query position"),
                 alt.Tooltip("key:N"), alt.Tooltip("col:O", title="key position"),
                 alt.Tooltip("weight:Q", format=".4f")],
        cell_px=cell_px,
    )


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


def _attention_modules(model: EncoderDecoder, kind: str) -> list[MultiHeadedAttention]:
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
    CPU. The maps also stay in each module's `.attn` for `attention_grid`.

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
    return {kind: [m.attn[0].cpu() for m in _attention_modules(model, kind)] for kind in ATTENTION_KINDS}


def _heads_grid(attn: Tensor, kind: str, layer: int, n_layers: int, src_tokens: Sequence[str],
                tgt_tokens: Sequence[str], heads: Sequence[int] | None, columns: int) -> alt.ConcatChart:
    """The charts of `heads` of one layer's maps attn (h, T, S); `layer` is 0-based, `n_layers` for the title."""
    info = kind_info(kind)
    tokens = {"src": src_tokens, "tgt": tgt_tokens}
    n_heads = attn.size(0)
    heads = list(range(n_heads)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"heads {bad} do not exist: the layer has {n_heads} heads (0..{n_heads - 1})")
    charts = [attention_chart(attn[h], tokens[info.queries], tokens[info.keys], title=f"head {h + 1}")
              for h in heads]
    return alt.concat(*charts, columns=columns, title=alt.TitleParams(
        f"{info.title}, layer {layer + 1} of {n_layers}", fontSize=16, anchor="start"))


def attention_grid(model: EncoderDecoder, layer: int, kind: AttentionKind, src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], heads: Sequence[int] | None = None,
                   columns: int = 4) -> alt.ConcatChart:
    """Every head (or `heads`) of one layer's attention, `columns` maps per row.

    kind: "encoder" (source x source), "self" (target x target, the decoder's masked
    self-attention) or "src" (target x source, the decoder attending to the encoder's output).
    Reads the maps stored in `.attn` by the last forward pass run inside `keep_attention(model)`
    (see `collect_attention`) and shows the first sentence of that batch.
    """
    modules = _attention_modules(model, kind)
    layer = layer_index(layer, len(modules))
    attn = modules[layer].attn
    if attn is None:
        raise ValueError("no attention stored: run a forward pass inside keep_attention(model) first "
                         "(collect_attention does that)")
    return _heads_grid(attn[0], kind, layer, len(modules), src_tokens, tgt_tokens, heads, columns)


def attention_maps_grid(maps: dict[str, list[Tensor]], layer: int, kind: AttentionKind,
                        src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                        heads: Sequence[int] | None = None, columns: int = 4) -> alt.ConcatChart:
    """`attention_grid` drawn from the maps `collect_attention` returned rather than from the model.

    The returned maps stay valid whatever the model runs afterwards, whereas `.attn` holds only
    the last forward pass made inside `keep_attention`.
    """
    kind_info(kind)
    layer = layer_index(layer, len(maps[kind]))
    return _heads_grid(maps[kind][layer], kind, layer, len(maps[kind]), src_tokens, tgt_tokens, heads, columns)


# --------------------------------------------------------------------------- one sentence


def display_token(token: str) -> str:
    """A token as a chart label: SentencePiece's word-start marker removed (a lone marker is kept)."""
    return token.replace(SPM_SPACE, "") or token


def grid_columns(sa: SentenceAttention, kind: str, most: int = 4) -> int:
    """How many heads fit side by side within GRID_ROW_PX for this sentence (1 to `most`)."""
    n_keys = len(sa.tgt_tokens if kind_info(kind).keys == "tgt" else sa.src_tokens)
    head_px = max(CELL_PX * n_keys, 120) + 80  # the map plus its axis labels
    return max(1, min(most, GRID_ROW_PX // head_px))


@dataclass
class SentenceAttention:
    """One sentence, its translation, and every attention map of the teacher-forced pass over both.

    src_ids are the encoder's input (<s> ... </s>); tgt_ids the decoder's input (<s> + the
    translation, no </s>: the last position is the one that predicted </s>). The token lists
    label the same positions for display. attention: {"encoder": [(h, S, S)] * N,
    "self": [(h, T, T)] * N, "src": [(h, T, S)] * N}, as `collect_attention` returns.
    """

    sentence: str
    translation: str
    src_ids: list[int]
    tgt_ids: list[int]
    src_tokens: list[str]
    tgt_tokens: list[str]
    attention: dict[str, list[Tensor]] = field(repr=False)
    truncated: bool = False
    layer_src_tokens: list[list[str]] | None = None  # token merging/pruning: each encoder layer's source labels
    memory_tokens: list[str] | None = None  # ... and the memory's, which encoder-decoder attention reads

    @property
    def n_layers(self) -> int:
        """Encoder (= decoder) layers of the model."""
        return len(self.attention["encoder"])

    def grid(self, layer: int, kind: AttentionKind, heads: Sequence[int] | None = None,
             columns: int | None = None) -> alt.ConcatChart:
        """The heads (default all) of one layer (0-based) for kind "encoder", "self" or "src".

        columns: heads per grid row; by default as many as fit in about GRID_ROW_PX pixels.
        """
        columns = columns or grid_columns(self, kind)
        src_tokens = self.src_tokens
        if kind == "encoder" and self.layer_src_tokens is not None:
            src_tokens = self.layer_src_tokens[layer_index(layer, self.n_layers)]
        elif kind == "src" and self.memory_tokens is not None:
            src_tokens = self.memory_tokens
        return attention_maps_grid(self.attention, layer, kind, src_tokens, self.tgt_tokens,
                                   heads=heads, columns=columns)


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


def _source_labels(translator: Translator, sentence: str, ids: list[int]) -> list[str]:
    """A label per source id: the vocabulary's token, or, for an unknown word, the word as typed."""
    text = translator.text
    labels = text.vocab("src").lookup_tokens(ids)
    if text.mode == "word":
        # ids = <s>, one id per word (cut to max_sentence_len with </s> kept), </s>: word k sits at position k + 1.
        words = text.tokenize(sentence, "src")
        for pos, word in enumerate(words[: len(ids) - 2], start=1):
            if ids[pos] == text.unk_id:
                labels[pos] = f"{word} (unk)"  # the model saw <unk>; the reader wants the word
    return [display_token(t) for t in labels]


def sentence_attention(translator: Translator, sentence: str, beam_size: int = 1) -> SentenceAttention:
    """Translate `sentence` (greedy, or beam search when beam_size > 1), then collect every attention map."""
    if not sentence.strip():
        raise UserError("the sentence is empty; give the source-language text to translate")
    if beam_size < 1:
        raise UserError(f"the beam size must be at least 1, got {beam_size}")
    text, dec = translator.text, translator.config.decode
    src_ids, truncated = translator.source_ids(sentence)
    out_ids = translate_ids(translator.model, [src_ids], pad=text.pad_id, bos=text.bos_id, eos=text.eos_id,
                            device=translator.device, beam_size=beam_size, alpha=dec.alpha,
                            max_len_a=dec.max_len_a, batch_size=1, amp_dtype=translator.amp_dtype)[0]
    tgt_ids = [text.bos_id, *out_ids]
    # lookup_tokens maps every id, so the labels stay aligned with the positions even if the
    # output holds an id that decode_tokens would drop.
    tgt_tokens = ["<s>", *(display_token(t) for t in text.vocab("tgt").lookup_tokens(out_ids))]
    attention = collect_attention(translator.model, torch.tensor(src_ids), None, torch.tensor(tgt_ids))
    src_tokens = _source_labels(translator, sentence, src_ids)
    layer_src_tokens, memory_tokens = merged_source_tokens(translator.model, src_ids, src_tokens)
    return SentenceAttention(sentence=sentence, translation=text.ids_to_text(out_ids, "tgt"), src_ids=src_ids,
                             tgt_ids=tgt_ids, src_tokens=src_tokens, tgt_tokens=tgt_tokens, attention=attention,
                             truncated=truncated, layer_src_tokens=layer_src_tokens, memory_tokens=memory_tokens)


def attention_charts(sa: SentenceAttention, layers: Sequence[int]) -> list[tuple[str, str, alt.TopLevelMixin]]:
    """(file stem, heading, chart) of the three attention grids of each 0-based layer in `layers`."""
    charts = []
    for layer in layers:
        for kind, info in KINDS.items():
            heading = f"Layer {layer + 1}: {info.title[0].lower()}{info.title[1:]}"
            charts.append((f"attention_layer{layer + 1}_{info.file}", heading, sa.grid(layer, kind)))
    return charts
