"""notebooks/attention_visualization.ipynb runs headless from top to bottom and draws every chart.

The notebook runs as stored (CHECKPOINT empty, so it trains its tiny model), with one injected cell,
as papermill would inject parameters: the session's data folder and cache, and fewer steps to keep
the test quick. It is stored without outputs, so a diff shows only what a person changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks/attention_visualization.ipynb"
CHART_MIMES = ("image/png", "image/svg+xml", "application/vnd.vegalite.v5+json")


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


def test_notebook_runs_and_draws_every_chart(venv_kernel, multi30k_dir, data_cache_dir, tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    overrides = [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}", "train.max_steps=60"]
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
    assert len(chart_cells) == 9  # mask, encoding, schedule, smoothing, penalty, 3 attention kinds, curves
    for cell in chart_cells:
        mimes = {m for o in cell.outputs if o["output_type"] in ("display_data", "execute_result")
                 for m in o.get("data", {})}
        assert mimes & set(CHART_MIMES), (cell.source, mimes)
