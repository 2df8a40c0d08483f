"""notebooks/attention_visualization.ipynb runs headless from top to bottom and draws every chart.

The notebook runs as stored (CHECKPOINT empty, so it trains its tiny model), with one injected cell,
as papermill would inject parameters: the session's data folder and cache, and fewer steps to keep
the test quick. It is stored without outputs, so a diff shows only what a person changed.

Every chart output is interactive offline (HTML carrying the Vega JavaScript, nothing fetched) and
keeps a PNG beside it for viewers that run no JavaScript.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks/attention_visualization.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    first = nb.cells[0]
    assert "parameters" in first.metadata.get("tags", []) and 'CHECKPOINT = ""' in first.source


@pytest.fixture()
def venv_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A 'python3' kernel that is this interpreter, whatever kernels the user has installed.

    JUPYTER_PATH is searched before the user's and the system's kernel folders, so this spec wins.
    """
    spec_dir = tmp_path / "jupyter/kernels/python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (test)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def check_chart_output(output: dict, source: str) -> None:
    """One chart's output: interactive HTML with the Vega JavaScript inlined, and a PNG."""
    data = output["data"]
    assert {"text/html", "image/png"} <= set(data), (source, sorted(data))
    html = data["text/html"]
    html = "".join(html) if isinstance(html, list) else html
    assert "window.vegaEmbed" in html and "vegaEmbed(el, spec, opts)" in html, source  # the bundle, then the chart
    assert len(html) > 300_000, source  # vega + vega-lite + vega-embed inlined, not linked
    # Nothing is fetched: no script or stylesheet from anywhere, so the chart draws offline.
    assert re.search(r"<script[^>]*\ssrc\s*=", html) is None and re.search(r"<link[^>]*href=", html) is None
    assert "data:image/png;base64," in html  # the PNG shows until the chart is drawn, or where no script runs
    assert base64.b64decode(data["image/png"])[:8] == PNG_MAGIC


@pytest.mark.slow
def test_notebook_runs_and_draws_every_chart(venv_kernel, multi30k_dir, data_cache_dir, monkeypatch):
    # The notebook runs in notebooks/: a relative MULTI30K_DIR would point elsewhere from there.
    data_dir, cache_dir = multi30k_dir.resolve(), data_cache_dir.resolve()
    monkeypatch.setenv("MULTI30K_DIR", str(data_dir))  # the kernel inherits it
    nb = nbformat.read(NOTEBOOK, as_version=4)
    overrides = [f"data.root={data_dir}", f"data.cache_dir={cache_dir}", "train.max_steps=60"]
    injected = nbformat.v4.new_code_cell(f"TRAIN_OVERRIDES = {overrides!r}\n"
                                         "import sys\nprint(sys.executable)")
    nb.cells.insert(1, injected)
    client = nbclient.NotebookClient(nb, kernel_name=venv_kernel, timeout=600,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    # The kernel is this virtual environment's interpreter.
    assert injected.outputs[0]["text"].strip() == sys.executable
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o["output_type"] == "error"], cell.source
    chart_cells = [c for c in nb.cells if "chart" in c.metadata.get("tags", [])]
    assert len(chart_cells) == 10  # mask, encoding, schedule, smoothing, penalty, 3 attention kinds, extensions, curves
    for cell in chart_cells:
        charts = [o for o in cell.outputs if o["output_type"] in ("display_data", "execute_result")]
        assert charts, cell.source
        for output in charts:
            check_chart_output(output, cell.source)
