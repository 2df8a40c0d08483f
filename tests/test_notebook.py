"""notebooks/attention_visualization.ipynb runs headless from top to bottom and draws every chart.

The notebook runs as stored, with one injected cell, as papermill would inject parameters: the
session's data folder and cache, and fewer steps to keep the test quick. $AT_RUN_DIR points it at a
run directory: a missing one makes it train its tiny model in a temporary folder (which must be gone
afterwards, even when training fails), an existing one is used as it is. It is stored without
outputs, so a diff shows only what a person changed.

Every chart output is interactive offline (HTML carrying the Vega JavaScript, nothing fetched) and
keeps a PNG beside it for viewers that run no JavaScript.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
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
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")  # it opens with its title
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first.metadata.get("tags", [])
    assert 'RUN_DIR = ""' in first.source and 'CHECKPOINT = ""' in first.source


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


def run_notebook(nb, kernel: str, data_dir: Path, cache_dir: Path, overrides: tuple[str, ...] = ()):
    """Execute `nb` in place with the session's data and a short training (a failing cell raises
    CellExecutionError, leaving the outputs so far in `nb`); returns the injected cell, taken out again."""
    train = [f"data.root={data_dir}", f"data.cache_dir={cache_dir}", "train.max_steps=20", *overrides]
    injected = nbformat.v4.new_code_cell(f"TRAIN_OVERRIDES = {train!r}\n"
                                         "import sys\nprint(sys.executable)")
    parameters = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(parameters + 1, injected)  # after the parameters cell, where papermill puts its own
    client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=600,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()
    finally:
        nb.cells.remove(injected)
    return injected


def text_of(cell) -> str:
    """Everything a cell printed or displayed as text or Markdown."""
    parts = []
    for output in cell.outputs:
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] in ("display_data", "execute_result"):
            parts.append(output["data"].get("text/markdown", output["data"].get("text/plain", "")))
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def model_cell(nb):
    """The cell that finds or trains the model (it displays "**The model:** ...")."""
    return next(c for c in nb.cells if c.cell_type == "code" and "TEMP_RUN_DIR = None" in c.source)


def temp_folder(cell) -> Path:
    """The temporary folder the model cell says it trained in."""
    found = re.search(r"training the tiny model in (\S+), deleted when this cell ends", text_of(cell))
    assert found, text_of(cell)
    return Path(found.group(1))


def check_every_chart(nb) -> None:
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


@pytest.mark.slow
def test_notebook_trains_in_a_folder_it_removes_and_draws_every_chart(venv_kernel, multi30k_dir, data_cache_dir,
                                                                      monkeypatch, tmp_path):
    # The notebook runs in notebooks/: a relative MULTI30K_DIR would point elsewhere from there.
    data_dir, cache_dir = multi30k_dir.resolve(), data_cache_dir.resolve()
    monkeypatch.setenv("MULTI30K_DIR", str(data_dir))  # the kernel inherits it
    monkeypatch.setenv("AT_RUN_DIR", str(tmp_path / "no_run"))  # whatever runs/cpu_15min holds here
    nb = nbformat.read(NOTEBOOK, as_version=4)
    injected = run_notebook(nb, venv_kernel, data_dir, cache_dir)

    # The kernel is this virtual environment's interpreter.
    assert injected.outputs[0]["text"].strip() == sys.executable
    cell = model_cell(nb)
    folder = temp_folder(cell)
    assert folder.name.startswith("attention_notebook_") and not folder.exists()
    assert f"no run in `{tmp_path / 'no_run'}`" in text_of(cell)
    assert "epoch 1/1 | step 20/20 |" in text_of(cell)  # it trained there
    said = text_of(cell)  # the finished run's translate command is followed by a word that its folder is gone
    assert said.index(f"--checkpoint {folder}/") < said.index(f"(the translate command above names {folder}, deleted")
    check_every_chart(nb)
    guided = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("if GUIDED_CHECKPOINT:"))
    assert "the guided-attention chart is skipped" in text_of(guided)


@pytest.mark.slow
def test_notebook_removes_its_folder_when_training_fails(venv_kernel, multi30k_dir, data_cache_dir, monkeypatch,
                                                         tmp_path):
    data_dir, cache_dir = multi30k_dir.resolve(), data_cache_dir.resolve()
    monkeypatch.setenv("AT_RUN_DIR", str(tmp_path / "no_run"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = model_cell(nb)
    nb.cells = nb.cells[:nb.cells.index(cell) + 1]  # up to the cell that trains
    diverging = ("train.lr_factor=1e12", "train.log_every=1")
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="training diverged"):
        run_notebook(nb, venv_kernel, data_dir, cache_dir, diverging)
    assert [o["ename"] for o in cell.outputs if o["output_type"] == "error"] == ["TrainingDiverged"]
    folder = temp_folder(cell)
    assert folder.name.startswith("attention_notebook_") and not folder.exists()


@pytest.mark.slow
def test_notebook_uses_an_existing_run_directory(venv_kernel, multi30k_dir, data_cache_dir, tiny_checkpoint,
                                                 monkeypatch, tmp_path):
    """A run directory whose final record chose its average: the notebook loads avg.safetensors, trains nothing, and
    draws the run's training curves (the cells in between draw what they draw for any model: the test above)."""
    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run)
    shutil.copy(run / "best.safetensors", run / "avg.safetensors")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "final", "step": 60, "checkpoint": "avg.safetensors",
                            "checkpoint_file": "avg.safetensors"}) + "\n")
    monkeypatch.setenv("AT_RUN_DIR", str(run))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = model_cell(nb)
    curves = nb.cells[-1]
    assert curves.source.startswith("if curves is not None:")
    nb.cells = [*nb.cells[:nb.cells.index(cell) + 1], curves]  # up to the model, then the curves
    run_notebook(nb, venv_kernel, multi30k_dir.resolve(), data_cache_dir.resolve())
    shown = text_of(cell)
    assert f"`avg.safetensors` of the run in `{run}`, the weights the run chose at its end" in shown, shown
    assert "training the tiny model" not in shown and "epoch 1/" not in shown
    charts = [o for o in curves.outputs if o["output_type"] in ("display_data", "execute_result")]
    assert len(charts) == 1 and not [o for o in curves.outputs if o["output_type"] == "error"]
    check_chart_output(charts[0], curves.source)
