"""Altair charts of the Transformer's parts, its training, and what a trained model attends to.

Teaching charts (no model needed):
    mask_chart                 the decoder's subsequent mask
    positional_encoding_chart  sinusoids of a few positional-encoding dimensions
    lr_schedule_chart          the Noam learning-rate schedule for several settings
    label_smoothing_chart      the label-smoothed target distribution
    loss_penalty_chart         how label smoothing penalises over-confident predictions
Model charts:
    collect_attention          one teacher-forced forward pass that keeps every attention map
    attention_grid             the heads of one layer's encoder / decoder-self / decoder-source attention
    attention_maps_grid        the same, from the maps collect_attention returned
    attention_chart            one head's (T, S) map, tokens on the axes, weight in the tooltip
Run charts:
    training_curves_chart      loss, learning rate and BLEU from a run's metrics.jsonl
Saving and showing:
    save_chart                 .html with the Vega JavaScript inlined (opens offline) and .png
    enable_notebook_charts     charts in Jupyter as locally drawn PNGs (no internet needed)

Conventions: layer and head arguments are 0-based Python indices; chart titles count from 1,
as the paper and the notebook do ("layer 1" is `layers[0]`).

Chart data is passed as inline `alt.Data(values=[...])` records. Altair applies its
max-rows limit (5,000) only to data frames that go through its data transformer, so
inline records never hit it and no global altair setting is changed (`enable_notebook_charts`
switches the renderer, when asked to); `save_chart` lifts the limit inside a `with` block for
charts built elsewhere from data frames.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import altair as alt
import torch
from torch import Tensor

from .loss import LabelSmoothing
from .model import EncoderDecoder, MultiHeadedAttention, PositionalEncoding, subsequent_mask
from .optim import rate

AttentionKind = Literal["encoder", "self", "src"]
ATTENTION_KINDS: tuple[str, ...] = ("encoder", "self", "src")
_KIND_TITLES = {"encoder": "Encoder self-attention", "self": "Decoder self-attention",
                "src": "Decoder-source attention"}

# The three settings the notebook compares: (model_size, factor, warmup).
NOTEBOOK_LR_SETTINGS: tuple[tuple[int, float, int], ...] = ((512, 1, 4000), (512, 1, 8000), (256, 1, 4000))

# One matrix cell in pixels: big enough for an 11 px axis label per row and column.
CELL_PX = 16


# --------------------------------------------------------------------------- shared pieces


def _inline(rows: list[dict[str, Any]]) -> alt.Data:
    """Records as inline chart data (never subject to altair's max-rows limit, see the module docstring)."""
    return alt.Data(values=rows)


def _index_labels(labels: Sequence[str]) -> str:
    """A Vega expression that maps an axis position 0..n-1 to its label.

    Matrix axes are encoded by position (an ordinal integer field), not by the label text:
    positions sort in sentence order and a token that occurs twice ("a ... a") keeps two
    distinct rows. This expression then prints the token text at each position.
    `json.dumps` gives a valid JavaScript array literal with every quote escaped.
    """
    return f"{json.dumps([str(t) for t in labels], ensure_ascii=False)}[datum.value]"


def _matrix_chart(rows: list[dict[str, Any]], row_labels: Sequence[str], col_labels: Sequence[str], *,
                  title: str | alt.TitleParams, row_title: str, col_title: str,
                  color: alt.Color, tooltip: list[alt.Tooltip], cell_px: int = CELL_PX) -> alt.Chart:
    """A heatmap of `rows` (integer fields `row` and `col`, plus what `color` and `tooltip` name),
    with `row_labels` / `col_labels` printed on the axes in index order."""
    n_rows, n_cols = len(row_labels), len(col_labels)
    # Column labels stay horizontal when they fit in a cell (about 7 px a character), else they slant.
    fits = max((len(str(t)) for t in col_labels), default=0) * 7 <= cell_px
    x_axis = (alt.Axis(labelExpr=_index_labels(col_labels), labelAngle=0) if fits else
              alt.Axis(labelExpr=_index_labels(col_labels), labelAngle=-60, labelAlign="right"))
    return alt.Chart(_inline(rows), title=title).mark_rect().encode(
        x=alt.X("col:O", sort="ascending", title=col_title, axis=x_axis),
        y=alt.Y("row:O", sort="ascending", title=row_title, axis=alt.Axis(labelExpr=_index_labels(row_labels))),
        color=color,
        tooltip=tooltip,
    ).properties(width=max(cell_px * n_cols, 120), height=max(cell_px * n_rows, 120))


# --------------------------------------------------------------------------- teaching charts


def mask_chart(size: int = 20) -> alt.Chart:
    """The subsequent mask `subsequent_mask(size)`: query position i may attend to key positions j <= i."""
    mask = subsequent_mask(size)[0]  # (size, size), True = may attend
    rows = [{"row": i, "col": j, "allowed": bool(mask[i, j])} for i in range(size) for j in range(size)]
    positions = [str(i) for i in range(size)]
    return _matrix_chart(
        rows, positions, positions,
        title=alt.TitleParams("Subsequent mask", subtitle="position i may attend to positions 0..i only"),
        row_title="query position i", col_title="key position j",
        color=alt.Color("allowed:N", title="may attend",
                        scale=alt.Scale(domain=[True, False], range=["#2a6fbb", "#eeeeee"])),
        tooltip=[alt.Tooltip("row:O", title="query i"), alt.Tooltip("col:O", title="key j"),
                 alt.Tooltip("allowed:N", title="may attend")],
    )


def positional_encoding_chart(d_model: int = 20, dims: Sequence[int] = (4, 5, 6, 7),
                              length: int = 100) -> alt.Chart:
    """Values of a few dimensions of the sinusoidal positional encoding over `length` positions."""
    if not all(0 <= d < d_model for d in dims):
        raise ValueError(f"dims {list(dims)} must lie in 0..{d_model - 1}")
    pe = PositionalEncoding(d_model, dropout=0.0, max_len=length)
    values = pe(torch.zeros(1, length, d_model))[0]  # (length, d_model): the encoding alone
    rows = [{"position": p, "value": float(values[p, d]), "dimension": f"dim {d}"}
            for d in dims for p in range(length)]
    return alt.Chart(_inline(rows), title=alt.TitleParams(
        "Positional encoding", subtitle=f"dimensions {', '.join(map(str, dims))} of d_model = {d_model}: "
                                        "even = sin, odd = cos, the wavelength grows with the dimension",
    )).mark_line().encode(
        x=alt.X("position:Q", title="position"),
        y=alt.Y("value:Q", title="encoding value"),
        color=alt.Color("dimension:N", title="dimension", sort=[f"dim {d}" for d in dims]),
        tooltip=["dimension:N", "position:Q", alt.Tooltip("value:Q", format=".4f")],
    ).properties(width=600, height=250)


def _lr_label(model_size: int, factor: float, warmup: int) -> str:
    return f"d_model={model_size}, factor={factor:g}, warmup={warmup}"


def lr_schedule_chart(settings: Sequence[tuple[int, float, int]] = NOTEBOOK_LR_SETTINGS,
                      total_steps: int = 20_000, every: int = 20) -> alt.Chart:
    """`rate(step, model_size, factor, warmup)` for each (model_size, factor, warmup) setting.

    Sampled every `every` steps to keep the chart data small; each setting's `warmup` step
    (where the rate peaks) is always included so the plotted maximum is the true maximum.
    """
    steps = sorted({1, total_steps, *range(every, total_steps + 1, every), *(w for _, _, w in settings)})
    rows = [{"step": s, "lr": rate(s, m, f, w), "setting": _lr_label(m, f, w)}
            for m, f, w in settings for s in steps if s <= total_steps]
    return alt.Chart(_inline(rows), title=alt.TitleParams(
        "Learning-rate schedule (Noam)",
        subtitle="factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up, then 1/sqrt(step)",
    )).mark_line().encode(
        x=alt.X("step:Q", title="training step"),
        y=alt.Y("lr:Q", title="learning rate"),
        color=alt.Color("setting:N", title="setting", sort=[_lr_label(*s) for s in settings],
                        legend=alt.Legend(labelLimit=400)),  # the default limit cuts off the warm-up
        tooltip=["setting:N", "step:Q", alt.Tooltip("lr:Q", format=".3e")],
    ).properties(width=600, height=300)


def label_smoothing_chart(size: int = 5, padding_idx: int = 0, smoothing: float = 0.4,
                          targets: Sequence[int] = (2, 1, 0, 3, 3)) -> alt.Chart:
    """The label-smoothed target distribution (`LabelSmoothing.smoothed_targets`), one row per target.

    The true token gets 1 - smoothing, the padding column gets 0, the rest share `smoothing`;
    a row whose target is padding is all zeros (it does not count in the loss).
    """
    crit = LabelSmoothing(size, padding_idx, smoothing)
    dist = crit.smoothed_targets(torch.tensor(list(targets)))  # (N, size)
    rows = [{"row": i, "col": j, "weight": float(dist[i, j]), "target": int(t)}
            for i, t in enumerate(targets) for j in range(size)]
    row_labels = [f"target {t}{' (padding)' if t == padding_idx else ''}" for t in targets]
    col_labels = [f"{j}{' (pad)' if j == padding_idx else ''}" for j in range(size)]
    heat = _matrix_chart(
        rows, row_labels, col_labels,
        title=alt.TitleParams("Label-smoothed targets",
                              subtitle=f"size {size}, padding {padding_idx}, smoothing {smoothing:g}"),
        row_title="example", col_title="vocabulary token",
        color=alt.Color("weight:Q", title="target weight", scale=alt.Scale(scheme="blues", domain=[0, 1])),
        tooltip=[alt.Tooltip("target:O", title="true token"), alt.Tooltip("col:O", title="token"),
                 alt.Tooltip("weight:Q", format=".4f")],
        cell_px=60,
    )
    # The numbers themselves are the lesson, so print them in the cells.
    text = heat.mark_text(fontSize=12).encode(
        text=alt.Text("weight:Q", format=".3f"),
        color=alt.when("datum.weight > 0.5").then(alt.value("white")).otherwise(alt.value("black")),
    )
    return heat + text


def loss_penalty_chart(smoothing: float = 0.1, max_x: int = 99) -> alt.Chart:
    """Label-smoothed loss of the prediction [0, x/d, 1/d, 1/d, 1/d] (d = x + 3) for target 1, x = 1..max_x.

    As x grows the model grows more confident in the true token. The loss falls until the
    predicted probability x/d reaches the target weight 1 - smoothing, then rises again:
    label smoothing penalises over-confidence.
    """
    crit = LabelSmoothing(5, 0, smoothing)
    rows = []
    for x in range(1, max_x + 1):
        d = x + 3
        predict = torch.tensor([[0.0, x / d, 1 / d, 1 / d, 1 / d]])
        # log(0) = -inf in the padding column: our LabelSmoothing leaves that column out, so the loss is finite.
        loss = float(crit(predict.log(), torch.tensor([1])))
        rows.append({"x": x, "loss": loss, "p_true": x / d})
    best = min(rows, key=lambda r: r["loss"])
    base = alt.Chart(_inline(rows), title=alt.TitleParams(
        "Label smoothing penalises over-confidence",
        subtitle=f"smoothing {smoothing:g}: the loss is lowest where p(true token) = {1 - smoothing:g}, not 1",
    ))
    tooltip = [alt.Tooltip("x:Q"), alt.Tooltip("p_true:Q", title="p(true token)", format=".3f"),
               alt.Tooltip("loss:Q", format=".4f")]
    line = base.mark_line().encode(
        x=alt.X("x:Q", title="x  (prediction x/d for the true token, 1/d for each other, d = x + 3)"),
        y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)),
        tooltip=tooltip,
    )
    minimum = alt.Chart(_inline([best])).mark_point(color="firebrick", size=80, filled=True).encode(
        x="x:Q", y="loss:Q", tooltip=tooltip)
    label = minimum.mark_text(align="left", dx=8, dy=-10, color="firebrick").encode(
        text=alt.value(f"minimum at x = {best['x']} (p = {best['p_true']:.2f})"))
    return (line + minimum + label).properties(width=600, height=300)


# --------------------------------------------------------------------------- attention


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
    return _matrix_chart(
        rows, row_tokens, col_tokens, title=title,
        row_title="query", col_title="key",
        color=alt.Color("weight:Q", title="weight", scale=alt.Scale(scheme="viridis")),
        tooltip=[alt.Tooltip("query:N"), alt.Tooltip("row:O", title="query position"),
                 alt.Tooltip("key:N"), alt.Tooltip("col:O", title="key position"),
                 alt.Tooltip("weight:Q", format=".4f")],
        cell_px=cell_px,
    )


def _attention_modules(model: EncoderDecoder, kind: str) -> list[MultiHeadedAttention]:
    """The attention sublayers of one kind, one per layer."""
    if kind == "encoder":
        return [layer.self_attn for layer in model.encoder.layers]
    if kind == "self":
        return [layer.self_attn for layer in model.decoder.layers]
    if kind == "src":
        return [layer.src_attn for layer in model.decoder.layers]
    raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}")


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
        with model.keep_attention():
            memory = model.encode(src, src_mask)
            model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1), device=device))
    finally:
        model.train(was_training)
    return {kind: [m.attn[0].cpu() for m in _attention_modules(model, kind)] for kind in ATTENTION_KINDS}


def _heads_grid(attn: Tensor, kind: str, layer: int, n_layers: int, src_tokens: Sequence[str],
                tgt_tokens: Sequence[str], heads: Sequence[int] | None, columns: int) -> alt.ConcatChart:
    """The charts of `heads` of one layer's maps attn (h, T, S); `layer` is 0-based, `n_layers` for the title."""
    rows, cols = {"encoder": (src_tokens, src_tokens), "self": (tgt_tokens, tgt_tokens),
                  "src": (tgt_tokens, src_tokens)}[kind]
    n_heads = attn.size(0)
    heads = list(range(n_heads)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise ValueError(f"heads {bad} do not exist: the layer has {n_heads} heads (0..{n_heads - 1})")
    charts = [attention_chart(attn[h], rows, cols, title=f"head {h + 1}") for h in heads]
    return alt.concat(*charts, columns=columns, title=alt.TitleParams(
        f"{_KIND_TITLES[kind]}, layer {layer + 1} of {n_layers}", fontSize=16, anchor="start"))


def _check_layer(layer: int, n_layers: int) -> int:
    """`layer` as a non-negative index (negative ones count from the end), or a ValueError."""
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer {layer} does not exist: the model has {n_layers} layers (0..{n_layers - 1})")
    return layer % n_layers


def attention_grid(model: EncoderDecoder, layer: int, kind: AttentionKind, src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], heads: Sequence[int] | None = None,
                   columns: int = 4) -> alt.ConcatChart:
    """Every head (or `heads`) of one layer's attention, `columns` maps per row.

    kind: "encoder" (source x source), "self" (target x target, the decoder's masked
    self-attention) or "src" (target x source, the decoder attending to the encoder's output).
    Reads the maps stored in `.attn` by the last forward pass run inside `model.keep_attention()`
    (see `collect_attention`) and shows the first sentence of that batch.
    """
    modules = _attention_modules(model, kind)
    layer = _check_layer(layer, len(modules))
    attn = modules[layer].attn
    if attn is None:
        raise ValueError("no attention stored: run a forward pass inside model.keep_attention() first "
                         "(collect_attention does that)")
    return _heads_grid(attn[0], kind, layer, len(modules), src_tokens, tgt_tokens, heads, columns)


def attention_maps_grid(maps: dict[str, list[Tensor]], layer: int, kind: AttentionKind,
                        src_tokens: Sequence[str], tgt_tokens: Sequence[str],
                        heads: Sequence[int] | None = None, columns: int = 4) -> alt.ConcatChart:
    """`attention_grid` drawn from the maps `collect_attention` returned rather than from the model.

    The returned maps stay valid whatever the model runs afterwards, whereas `.attn` holds only
    the last forward pass made inside `keep_attention`.
    """
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {', '.join(ATTENTION_KINDS)}")
    layer = _check_layer(layer, len(maps[kind]))
    return _heads_grid(maps[kind][layer], kind, layer, len(maps[kind]), src_tokens, tgt_tokens, heads, columns)


# --------------------------------------------------------------------------- training curves


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a metrics.jsonl; blank lines and a half-written last line are skipped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # training may be writing the file right now
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _number(value: Any) -> float | None:
    """A finite float, or None for a missing, non-numeric or non-finite value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _series(records: list[dict[str, Any]], key: str, name: str) -> list[dict[str, Any]]:
    """(step, value, series) points of `key` from records that have both a step and a number there."""
    points = []
    for r in records:
        step, value = _number(r.get("step")), _number(r.get(key))
        if step is not None and value is not None:
            points.append({"step": step, "value": value, "series": name})
    return points


def _curve(points: list[dict[str, Any]], title: str, y_title: str, log_scale: bool = False) -> alt.Chart:
    names = list(dict.fromkeys(p["series"] for p in points))  # first-seen order for the legend
    log_scale = log_scale and all(p["value"] > 0 for p in points)  # log of 0 would drop the point
    return alt.Chart(_inline(points), title=title).mark_line(point=True).encode(
        x=alt.X("step:Q", title="optimizer step"),
        y=alt.Y("value:Q", title=y_title, scale=alt.Scale(type="log") if log_scale else alt.Scale(zero=False)),
        color=alt.Color("series:N", title=None, sort=names),
        tooltip=["series:N", "step:Q", alt.Tooltip("value:Q", format=".4g")],
    ).properties(width=600, height=220)


def training_curves_chart(metrics_path: str | Path) -> alt.VConcatChart:
    """Loss (train and validation), learning rate and, when logged, BLEU against the step, from metrics.jsonl.

    Training lines carry step / loss / lr; epoch-end lines carry train_loss / val_loss and maybe
    bleu; a final line may carry val_bleu / test_bleu. Missing keys are skipped.
    """
    records = _read_metrics(Path(metrics_path))
    loss = (_series(records, "loss", "train")
            + _series(records, "train_loss", "train (epoch mean)")
            + _series(records, "val_loss", "validation"))
    lr = _series(records, "lr", "learning rate")
    bleu = (_series(records, "bleu", "validation (greedy)")
            + _series(records, "val_bleu", "validation (best weights)")
            + _series(records, "test_bleu", "test (best weights)"))
    charts = []
    if loss:
        charts.append(_curve(loss, "Loss", "loss per token", log_scale=True))
    if lr:
        charts.append(_curve(lr, "Learning rate", "learning rate"))
    if bleu:
        charts.append(_curve(bleu, "BLEU", "BLEU"))
    if not charts:
        raise ValueError(f"{metrics_path} holds no loss, learning-rate or BLEU values to plot")
    return alt.vconcat(*charts).resolve_scale(color="independent")


# --------------------------------------------------------------------------- saving


def _vegalite_version() -> str | None:
    """The Vega-Lite version altair writes (e.g. '6.4'), when vl-convert bundles it; else its latest."""
    import vl_convert as vlc

    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vlc.get_vegalite_versions() else None


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over `path`: never a half-written file."""
    # A unique name opened with "x" (not mkstemp, whose files are private 0600): normal permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_chart(chart: alt.TopLevelMixin, path_without_suffix: str | Path,
               formats: Sequence[str] = ("html", "png"), scale: float = 2.0) -> list[Path]:
    """Write `chart` as `<path>.html` (Vega JavaScript inlined, opens offline) and `<path>.png`.

    `scale` multiplies the PNG's pixel size. Returns the written paths.
    """
    import vl_convert as vlc  # imported here: only saving needs the (large) converter

    unknown = set(formats) - {"html", "png"}
    if unknown:
        raise ValueError(f"unknown chart formats {sorted(unknown)}; choose from html, png")
    with alt.data_transformers.disable_max_rows():  # scoped: restored when the block ends
        spec = chart.to_dict()
    version = _vegalite_version()
    base = Path(path_without_suffix)
    base.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        if fmt == "html":
            data = vlc.vegalite_to_html(spec, vl_version=version, bundle=True).encode("utf-8")
        else:
            data = vlc.vegalite_to_png(spec, vl_version=version, scale=scale)
        # Append the suffix rather than with_suffix(): a name like "layer.1" must keep its dot.
        path = base.with_name(f"{base.name}.{fmt}")
        _write_atomically(path, data)
        written.append(path)
    return written


# --------------------------------------------------------------------------- notebooks

NOTEBOOK_RENDERER = "annotated_transformer"


def _notebook_bundle(spec: dict, png_scale: float = 2.0, **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chart as a PNG rendered locally by vl-convert, which every notebook front end shows offline.

    Altair's default renderer emits HTML that fetches Vega from a CDN, so charts stay blank without
    internet. Its Vega-Lite MIME output does not help either: JupyterLab's built-in renderer takes
    Vega-Lite 5 specs while altair 6 writes version 6, and nbformat rejects altair's v6 MIME type
    (it does not end in "+json") when the notebook is saved.
    """
    import vl_convert as vlc

    png = vlc.vegalite_to_png(spec, vl_version=_vegalite_version(), scale=png_scale)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # the IHDR chunk
    title = spec.get("title")
    title = title.get("text") if isinstance(title, dict) else title
    bundle = {"image/png": png, "text/plain": f"<chart: {title or 'untitled'}>"}
    # Show the PNG at its logical size: sharp on high-density screens, not twice as large.
    return bundle, {"image/png": {"width": width / png_scale, "height": height / png_scale}}


def enable_notebook_charts(png_scale: float = 2.0) -> None:
    """Show charts in Jupyter as PNGs drawn locally (no internet needed); call once per notebook."""
    if NOTEBOOK_RENDERER not in alt.renderers.names():
        alt.renderers.register(NOTEBOOK_RENDERER, _notebook_bundle)
    alt.renderers.enable(NOTEBOOK_RENDERER, png_scale=png_scale)
