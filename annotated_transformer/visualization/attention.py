"""Attention maps of one sentence, drawn: one chart a head, the heads of a layer side by side.

    from annotated_transformer import Translator, visualization as viz

    tr = Translator.load("runs/cpu_15min")                  # a run directory, or a model file
    sa = tr.attention("Ein Mann fährt Fahrrad.")             # translation, tokens, every attention map
    viz.sentence_grid(sa, layer=0, kind="src")               # one layer's decoder-source heads (a chart)

    attention_chart       one head's (T, S) map, tokens on the axes, weight in the tooltip
    sentence_grid         the heads of one layer's encoder / decoder-self / decoder-source attention of a sentence
    attention_grid        the same, from the maps a pass inside keep_attention left in the model
    attention_maps_grid   the same, from the maps collect_attention returned
    attention_charts      every grid of the chosen layers, with file names and headings (the visualize command)

The maps themselves (`Translator.attention`, `SentenceAttention`, `collect_attention`, `keep_attention`)
come from deploy/attention.py, which draws nothing; they are importable from here too.

Conventions: layer and head arguments are 0-based Python indices; chart titles count from 1, as the
paper and the notebook do ("layer 1" is `layers[0]`), and so do the layer numbers a user types
(`layer_indices`).
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import torch
from torch import Tensor

from ..deploy.attention import (ATTENTION_KINDS, KINDS, SPM_SPACE, AttentionKind, KindInfo, SentenceAttention,
                                attention_modules, collect_attention, display_token, keep_attention, kind_info,
                                layer_index)
from ..deploy.translator import Translator
from ..runtime.errors import UserError
from ..model import EncoderDecoder
from .heatmap import CELL_PX, heatmap

__all__ = ["ATTENTION_KINDS", "KINDS", "SPM_SPACE", "AttentionKind", "KindInfo", "SentenceAttention",
           "attention_chart", "attention_charts", "attention_grid", "attention_maps_grid", "collect_attention",
           "display_token", "grid_columns", "keep_attention", "kind_info", "layer_index", "layer_indices",
           "sentence_attention", "sentence_grid"]

# A grid row of about this many pixels still reads on a screen; wider grids wrap to fewer columns.
GRID_ROW_PX = 2400


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


def _heads_grid(attn: Tensor, kind: str, layer: int, n_layers: int, row_tokens: Sequence[str],
                col_tokens: Sequence[str], heads: Sequence[int] | None, columns: int) -> alt.ConcatChart:
    """The charts of `heads` of one layer's maps attn (h, T, S); `layer` is 0-based, `n_layers` for the title."""
    info = kind_info(kind)
    n_heads = attn.size(0)
    heads = list(range(n_heads)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"heads {bad} do not exist: the layer has {n_heads} heads (0..{n_heads - 1})")
    charts = [attention_chart(attn[h], row_tokens, col_tokens, title=f"head {h + 1}") for h in heads]
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
    modules = attention_modules(model, kind)
    layer = layer_index(layer, len(modules))
    attn = modules[layer].attn
    if attn is None:
        raise ValueError("no attention stored: run a forward pass inside keep_attention(model) first "
                         "(collect_attention does that)")
    return _heads_grid(attn[0], kind, layer, len(modules), *_labels(kind, src_tokens, tgt_tokens), heads, columns)


def attention_maps_grid(maps: dict[str, list[Tensor]], layer: int, kind: AttentionKind,
                        src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                        heads: Sequence[int] | None = None, columns: int = 4) -> alt.ConcatChart:
    """`attention_grid` drawn from the maps `collect_attention` returned rather than from the model.

    The returned maps stay valid whatever the model runs afterwards, whereas `.attn` holds only
    the last forward pass made inside `keep_attention`.
    """
    kind_info(kind)
    layer = layer_index(layer, len(maps[kind]))
    return _heads_grid(maps[kind][layer], kind, layer, len(maps[kind]), *_labels(kind, src_tokens, tgt_tokens),
                       heads, columns)


def _labels(kind: str, src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> tuple[Sequence[str], Sequence[str]]:
    """The row (query) and column (key) labels of a map of `kind`."""
    tokens = {"src": src_tokens, "tgt": tgt_tokens}
    return tokens[kind_info(kind).queries], tokens[kind_info(kind).keys]


# --------------------------------------------------------------------------- one sentence


def grid_columns(sa: SentenceAttention, kind: str, most: int = 4) -> int:
    """How many heads fit side by side within GRID_ROW_PX for this sentence (1 to `most`)."""
    n_keys = len(sa.tgt_tokens if kind_info(kind).keys == "tgt" else sa.src_tokens)
    head_px = max(CELL_PX * n_keys, 120) + 80  # the map plus its axis labels
    return max(1, min(most, GRID_ROW_PX // head_px))


def sentence_grid(sa: SentenceAttention, layer: int, kind: AttentionKind, heads: Sequence[int] | None = None,
                  columns: int | None = None) -> alt.ConcatChart:
    """The heads (default all) of one layer (0-based) of a sentence's attention (`Translator.attention`), for kind
    "encoder", "self" or "src"; columns: heads per grid row, by default as many as fit in about GRID_ROW_PX pixels."""
    kind_info(kind)
    layer = layer_index(layer, sa.n_layers)
    return _heads_grid(sa.attention[kind][layer], kind, layer, sa.n_layers, *sa.labels(layer, kind), heads,
                       columns or grid_columns(sa, kind))


def sentence_attention(translator: Translator, sentence: str, beam_size: int = 1) -> SentenceAttention:
    """`translator.attention(sentence)`, decoded greedily or with beam search when beam_size > 1 (the visualize
    command's --beam); a beam size below 1 is one UserError line."""
    if beam_size < 1:
        raise UserError(f"the beam size must be at least 1, got {beam_size}")
    return translator.attention(sentence, beam=beam_size)


def attention_charts(sa: SentenceAttention, layers: Sequence[int]) -> list[tuple[str, str, alt.TopLevelMixin]]:
    """(file stem, heading, chart) of the three attention grids of each 0-based layer in `layers`."""
    charts = []
    for layer in layers:
        for kind, info in KINDS.items():
            heading = f"Layer {layer + 1}: {info.title[0].lower()}{info.title[1:]}"
            charts.append((f"attention_layer{layer + 1}_{info.file}", heading, sentence_grid(sa, layer, kind)))
    return charts
