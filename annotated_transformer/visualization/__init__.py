"""Altair charts of the Transformer's parts, its training, and what a trained model attends to.

One module per thing drawn:

    teaching         the notebook's teaching charts: subsequent mask, positional encoding,
                     learning-rate schedules, label smoothing and its loss penalty
    attention        attention maps of a sentence (Translator.attention) drawn, one chart per head
    training_curves  loss, learning rate and BLEU of a run, from its metrics.jsonl
    rendering        offline HTML (the Vega JavaScript inlined, or shared by a folder) and PNG, as files and in Jupyter
    sentence_page    scripts/visualize.py's work: every chart of one sentence in a folder, with index.html
    heatmap          the matrix chart that the mask, label smoothing and attention maps share

    from annotated_transformer import visualization as viz
    viz.enable_notebook_charts()     # in Jupyter: interactive charts with a PNG fallback, offline
    viz.mask_chart(20)
    viz.save_chart(viz.lr_schedule_chart(), "viz/lr")   # viz/lr.html and viz/lr.png

The names below are loaded on first use, so importing this package does not import altair or
vl-convert; only drawing or saving a chart does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "teaching": ("NOTEBOOK_LR_SETTINGS", "label_smoothing_chart", "loss_penalty_chart", "lr_schedule_chart",
                 "mask_chart", "positional_encoding_chart", "teaching_charts"),
    "attention": ("ATTENTION_KINDS", "AttentionKind", "SPM_SPACE", "SentenceAttention", "attention_chart",
                  "attention_charts", "attention_grid", "attention_maps_grid", "collect_attention", "display_token",
                  "keep_attention", "layer_indices", "sentence_attention", "sentence_grid"),
    "training_curves": ("training_curves_chart",),
    "rendering": ("FORMATS", "SCRIPT_FILE", "chart_html", "chart_png", "enable_notebook_charts", "png_size",
                  "save_chart", "write_script"),
    "sentence_page": ("Visualization", "visualize_checkpoint", "visualize_sentence", "write_index"),
    "heatmap": ("CELL_PX",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "ATTENTION_KINDS", "CELL_PX", "FORMATS", "NOTEBOOK_LR_SETTINGS", "SCRIPT_FILE", "SPM_SPACE", "AttentionKind",
    "SentenceAttention", "Visualization", "attention_chart", "attention_charts", "attention_grid",
    "attention_maps_grid", "chart_html", "chart_png", "collect_attention", "display_token", "enable_notebook_charts",
    "keep_attention", "label_smoothing_chart", "layer_indices", "loss_penalty_chart", "lr_schedule_chart", "mask_chart",
    "png_size",
    "positional_encoding_chart", "save_chart", "sentence_attention", "sentence_grid", "teaching_charts",
    "training_curves_chart",
    "visualize_checkpoint", "visualize_sentence", "write_index", "write_script",
]

if TYPE_CHECKING:
    from .attention import (
        ATTENTION_KINDS,
        SPM_SPACE,
        AttentionKind,
        SentenceAttention,
        attention_chart,
        attention_charts,
        attention_grid,
        attention_maps_grid,
        collect_attention,
        display_token,
        keep_attention,
        layer_indices,
        sentence_attention,
        sentence_grid,
    )
    from .heatmap import CELL_PX
    from .rendering import (
        FORMATS,
        SCRIPT_FILE,
        chart_html,
        chart_png,
        enable_notebook_charts,
        png_size,
        save_chart,
        write_script,
    )
    from .sentence_page import Visualization, visualize_checkpoint, visualize_sentence, write_index
    from .teaching import (
        NOTEBOOK_LR_SETTINGS,
        label_smoothing_chart,
        loss_penalty_chart,
        lr_schedule_chart,
        mask_chart,
        positional_encoding_chart,
        teaching_charts,
    )
    from .training_curves import training_curves_chart


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
