"""The matrix chart that the mask, the label-smoothed targets and every attention map are drawn with.

Chart data is passed as inline `alt.Data(values=[...])` records. Altair applies its max-rows limit
(5,000) only to data frames that go through its data transformer, so inline records never hit it and
no global altair setting is changed (`save_chart` lifts the limit inside a `with` block for charts
built elsewhere from data frames).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import altair as alt

# One matrix cell in pixels: big enough for an 11 px axis label per row and column.
CELL_PX = 16


def inline_data(rows: list[dict[str, Any]]) -> alt.Data:
    """Records as inline chart data (never subject to altair's max-rows limit, see the module docstring)."""
    return alt.Data(values=rows)


def position_labels(labels: Sequence[str]) -> str:
    """A Vega expression that maps an axis position 0..n-1 to its label.

    Matrix axes are encoded by position (an ordinal integer field), not by the label text:
    positions sort in sentence order and a token that occurs twice ("a ... a") keeps two
    distinct rows. This expression then prints the token text at each position.
    `json.dumps` gives a valid JavaScript array literal with every quote escaped.
    """
    return f"{json.dumps([str(t) for t in labels], ensure_ascii=False)}[datum.value]"


def heatmap(rows: list[dict[str, Any]], row_labels: Sequence[str], col_labels: Sequence[str], *,
            title: str | alt.TitleParams, row_title: str, col_title: str,
            color: alt.Color, tooltip: list[alt.Tooltip], cell_px: int = CELL_PX) -> alt.Chart:
    """A heatmap of `rows` (integer fields `row` and `col`, plus what `color` and `tooltip` name),
    with `row_labels` / `col_labels` printed on the axes in index order."""
    n_rows, n_cols = len(row_labels), len(col_labels)
    # Column labels stay horizontal when they fit in a cell (about 7 px a character), else they slant.
    fits = max((len(str(t)) for t in col_labels), default=0) * 7 <= cell_px
    x_axis = (alt.Axis(labelExpr=position_labels(col_labels), labelAngle=0) if fits else
              alt.Axis(labelExpr=position_labels(col_labels), labelAngle=-60, labelAlign="right"))
    return alt.Chart(inline_data(rows), title=title).mark_rect().encode(
        x=alt.X("col:O", sort="ascending", title=col_title, axis=x_axis),
        y=alt.Y("row:O", sort="ascending", title=row_title, axis=alt.Axis(labelExpr=position_labels(row_labels))),
        color=color,
        tooltip=tooltip,
    ).properties(width=max(cell_px * n_cols, 120), height=max(cell_px * n_rows, 120))
