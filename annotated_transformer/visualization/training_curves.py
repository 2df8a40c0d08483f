"""Training curves of a run: loss, learning rate and BLEU against the optimizer step, from its metrics.jsonl."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import altair as alt

from ..harness.run_dir import read_metrics
from .heatmap import inline_data


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


def _curve(points: list[dict[str, Any]], title: str, y_title: str, log_scale: bool = False,
           y_format: str | None = None) -> alt.Chart:
    names = list(dict.fromkeys(p["series"] for p in points))  # first-seen order for the legend
    log_scale = log_scale and all(p["value"] > 0 for p in points)  # log of 0 would drop the point
    return alt.Chart(inline_data(points), title=title).mark_line(point=True).encode(
        x=alt.X("step:Q", title="optimizer step"),
        y=alt.Y("value:Q", title=y_title, scale=alt.Scale(type="log") if log_scale else alt.Scale(zero=False),
                axis=alt.Axis(format=y_format) if y_format else alt.Undefined),
        color=alt.Color("series:N", title=None, sort=names),
        tooltip=["series:N", "step:Q", alt.Tooltip("value:Q", format=".4g")],
    ).properties(width=600, height=220)


def training_curves_chart(metrics_path: str | Path) -> alt.VConcatChart:
    """Loss (train and validation), learning rate and, when logged, BLEU against the step, from metrics.jsonl.

    Training lines carry step / loss / lr; epoch-end lines carry train_loss / val_loss and maybe
    bleu; a final line may carry val_bleu / test_bleu. Missing keys are skipped.
    """
    records = read_metrics(metrics_path)
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
        # in exponent form: Vega's default rounds a rate of a few 1e-5 (one point, or an early run) to "0"
        charts.append(_curve(lr, "Learning rate", "learning rate", y_format=".2~e"))
    if bleu:
        charts.append(_curve(bleu, "BLEU", "BLEU"))
    if not charts:
        raise ValueError(f"{metrics_path} holds no loss, learning-rate or BLEU values to plot")
    return alt.vconcat(*charts).resolve_scale(color="independent")
