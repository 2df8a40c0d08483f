"""The notebook's teaching charts: the Transformer's parts and its training recipe, no trained model needed.

    mask_chart                 the decoder's subsequent mask
    positional_encoding_chart  sinusoids of a few positional-encoding dimensions
    lr_schedule_chart          the Noam learning-rate schedule for several settings
    label_smoothing_chart      the label-smoothed target distribution
    loss_penalty_chart         how label smoothing penalises over-confident predictions
    teaching_charts            all five, with file stems and headings, in the notebook's order
"""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import torch

from ..loss import LabelSmoothing
from ..model import PositionalEncoding, subsequent_mask
from ..optim import rate
from .heatmap import heatmap, inline_data

# The three settings the notebook compares: (model_size, factor, warmup).
NOTEBOOK_LR_SETTINGS: tuple[tuple[int, float, int], ...] = ((512, 1, 4000), (512, 1, 8000), (256, 1, 4000))


def mask_chart(size: int = 20) -> alt.Chart:
    """The subsequent mask `subsequent_mask(size)`: query position i may attend to key positions j <= i."""
    mask = subsequent_mask(size)[0]  # (size, size), True = may attend
    rows = [{"row": i, "col": j, "allowed": bool(mask[i, j])} for i in range(size) for j in range(size)]
    positions = [str(i) for i in range(size)]
    return heatmap(
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
    return alt.Chart(inline_data(rows), title=alt.TitleParams(
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
    return alt.Chart(inline_data(rows), title=alt.TitleParams(
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
    heat = heatmap(
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
    base = alt.Chart(inline_data(rows), title=alt.TitleParams(
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
    minimum = alt.Chart(inline_data([best])).mark_point(color="firebrick", size=80, filled=True).encode(
        x="x:Q", y="loss:Q", tooltip=tooltip)
    label = minimum.mark_text(align="left", dx=8, dy=-10, color="firebrick").encode(
        text=alt.value(f"minimum at x = {best['x']} (p = {best['p_true']:.2f})"))
    return (line + minimum + label).properties(width=600, height=300)


def teaching_charts() -> list[tuple[str, str, alt.TopLevelMixin]]:
    """(file stem, heading, chart) of the model-independent charts, in the notebook's order."""
    return [
        ("mask", "The subsequent mask", mask_chart()),
        ("positional_encoding", "Positional encoding", positional_encoding_chart()),
        ("lr_schedule", "Learning-rate schedule", lr_schedule_chart()),
        ("label_smoothing", "Label smoothing", label_smoothing_chart()),
        ("loss_penalty", "Label smoothing penalises over-confidence", loss_penalty_chart()),
    ]
