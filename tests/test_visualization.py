"""The charts of `annotated_transformer.visualization`: what their data encode, and how they are saved and shown."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import stat
import subprocess
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import altair as alt
import pytest
import torch

from annotated_transformer import visualization as viz
from annotated_transformer.runtime.errors import UserError
from annotated_transformer.harness.run_dir import RunDir, read_metrics
from annotated_transformer.model import MultiHeadedAttention, make_model
from annotated_transformer.optim import rate


def rows(spec: dict) -> list[dict]:
    """The inline data records of one (unit or layered) chart spec."""
    data = spec["data"]
    if "values" in data:
        return data["values"]
    raise AssertionError(f"expected inline data, got {data}")


def labels_of(axis_encoding: dict) -> list[str]:
    """The token list a position axis prints: the JSON array at the front of its labelExpr."""
    expr = axis_encoding["axis"]["labelExpr"]
    assert expr.endswith("[datum.value]")
    return json.loads(expr[: -len("[datum.value]")])


def by(records: list[dict], key: str) -> dict:
    groups: dict = defaultdict(list)
    for r in records:
        groups[r[key]].append(r)
    return groups


# --------------------------------------------------------------------------- teaching charts


def test_mask_chart_is_lower_triangular():
    spec = viz.mask_chart(20).to_dict()
    data = rows(spec)
    assert len(data) == 400
    assert all(r["allowed"] == (r["col"] <= r["row"]) for r in data)
    assert sum(r["allowed"] for r in data) == 20 * 21 // 2
    # query positions run down the rows, key positions along the columns, both in index order
    assert spec["encoding"]["y"]["field"] == "row" and spec["encoding"]["x"]["field"] == "col"
    assert labels_of(spec["encoding"]["y"]) == [str(i) for i in range(20)]


def test_positional_encoding_chart_follows_the_formula():
    data = rows(viz.positional_encoding_chart(d_model=20, dims=(4, 5, 6, 7), length=100).to_dict())
    series = by(data, "dimension")
    assert sorted(series) == ["dim 4", "dim 5", "dim 6", "dim 7"]
    for dim, points in series.items():
        d = int(dim.split()[1])
        freq = 10000 ** (-(d - d % 2) / 20)  # 2i / d_model with 2i = the even dimension of the pair
        wave = math.sin if d % 2 == 0 else math.cos
        assert [p["position"] for p in points] == list(range(100))
        for p in points:
            assert p["value"] == pytest.approx(wave(p["position"] * freq), abs=1e-5)
    with pytest.raises(ValueError, match="dims"):
        viz.positional_encoding_chart(d_model=8, dims=(8,))


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_lr_schedule_chart_has_three_series_peaking_at_their_warmup():
    data = rows(viz.lr_schedule_chart().to_dict())
    assert len(data) < 5000  # sampled, not 60,000 points
    series = by(data, "setting")
    assert len(series) == 3
    for (size, factor, warmup), label in zip(viz.NOTEBOOK_LR_SETTINGS, series, strict=True):
        points = series[label]
        assert label == f"d_model={size}, factor={factor}, warmup={warmup}"
        peak = max(points, key=lambda p: p["lr"])
        assert peak["step"] == warmup
        assert peak["lr"] == pytest.approx(rate(warmup, size, factor, warmup))
        assert points[-1]["step"] == 20_000
        assert all(p["lr"] == pytest.approx(rate(p["step"], size, factor, warmup)) for p in points)
    # sampled every 300 steps, the warm-up steps (not multiples of 300) are still there to peak
    coarse = by(rows(viz.lr_schedule_chart(every=300).to_dict()), "setting")
    for (_, _, warmup), points in zip(viz.NOTEBOOK_LR_SETTINGS, coarse.values(), strict=True):
        assert max(points, key=lambda p: p["lr"])["step"] == warmup
    peaks = {label: max(p["lr"] for p in pts) for label, pts in series.items()}
    # the smaller model gets the larger rate; the longer warm-up peaks lower
    assert peaks["d_model=256, factor=1, warmup=4000"] > peaks["d_model=512, factor=1, warmup=4000"] \
        > peaks["d_model=512, factor=1, warmup=8000"]


def test_label_smoothing_chart_shows_the_smoothed_targets():
    spec = viz.label_smoothing_chart().to_dict()  # LabelSmoothing(5, 0, 0.4), targets 2 1 0 3 3
    heat = spec["layer"][0]  # heatmap + printed numbers share the data, which altair lifts to the top
    data = rows(spec)
    assert len(data) == 25
    for row in by(data, "row").values():
        target = row[0]["target"]
        weights = [r["weight"] for r in sorted(row, key=lambda r: r["col"])]
        if target == 0:  # padding target: the row does not count
            assert weights == [0.0] * 5
            continue
        assert weights[0] == 0.0  # the padding column
        assert weights[target] == pytest.approx(0.6)
        assert sum(weights) == pytest.approx(1.0)
        assert all(w == pytest.approx(0.4 / 3) for j, w in enumerate(weights) if j not in (0, target))
    assert labels_of(heat["encoding"]["y"]) == ["target 2", "target 1", "target 0 (padding)", "target 3", "target 3"]


def test_loss_penalty_curve_is_finite_and_lowest_at_the_smoothed_confidence():
    """The notebook's illustration of LabelSmoothing (computed by the class itself): a growing probability on the
    right token, 0 on padding."""
    spec = viz.loss_penalty_chart().to_dict()  # LabelSmoothing(5, 0, 0.1), x = 1..99
    data = rows(spec["layer"][0])  # the curve; the other layers mark its minimum
    assert [r["x"] for r in data] == list(range(1, 100))
    losses = [r["loss"] for r in data]
    assert all(math.isfinite(v) for v in losses)  # the notebook's version gave nan here
    # -0.9 log(x/d) - 0.1 log(1/d) + const is lowest where x/d = 0.9, i.e. x = 27
    best = losses.index(min(losses)) + 1
    assert best == 27
    assert all(a > b for a, b in pairwise(losses[:27]))  # falls while under-confident
    assert all(a < b for a, b in pairwise(losses[26:]))  # rises once over-confident


# --------------------------------------------------------------------------- attention


def test_attention_chart_keeps_token_order_and_repeated_tokens():
    queries = ["<s>", "a", "dog", "and", "a", "cat"]
    keys = ["ein", "Hund", "und", "eine", "Katze", "ein", "</s>"]
    torch.manual_seed(0)
    attn = torch.randn(len(queries), len(keys)).softmax(-1)
    spec = viz.attention_chart(attn, queries, keys, title="test").to_dict()
    data = rows(spec)
    assert len(data) == len(queries) * len(keys)
    for i, row in by(data, "row").items():
        assert sum(r["weight"] for r in row) == pytest.approx(1.0, abs=1e-4)
        assert {r["query"] for r in row} == {queries[i]}
    assert all(r["key"] == keys[r["col"]] for r in data)
    assert all(r["weight"] == pytest.approx(float(attn[r["row"], r["col"]]), abs=1e-6) for r in data)
    # axes are positions in ascending order printed as tokens: sentence order, both "a"s kept
    x, y = spec["encoding"]["x"], spec["encoding"]["y"]
    assert (x["field"], x["type"], x["sort"]) == ("col", "ordinal", "ascending")
    assert (y["field"], y["type"], y["sort"]) == ("row", "ordinal", "ascending")
    assert labels_of(x) == keys and labels_of(y) == queries
    assert "weight" in [t["field"] for t in spec["encoding"]["tooltip"]]
    with pytest.raises(ValueError, match="does not match"):
        viz.attention_chart(attn, queries[:-1], keys, title="wrong")


def test_attention_chart_labels_survive_quotes():
    tokens = ['"', "'", "\\", "]"]
    spec = viz.attention_chart(torch.eye(4), tokens, tokens, title="quotes").to_dict()
    assert labels_of(spec["encoding"]["x"]) == tokens


@pytest.fixture()
def tiny_model():
    torch.manual_seed(0)
    # heavy dropout: if it were active, the stored probabilities would not sum to 1
    model = make_model(11, 11, N=2, d_model=16, d_ff=32, h=4, dropout=0.5)
    return model.train()


def test_collect_attention_returns_every_layer_in_eval_mode(tiny_model):
    src = torch.tensor([1, 2, 3, 4, 5])
    src_mask = torch.tensor([[[True, True, True, True, False]]])  # last source token is padding
    tgt = torch.tensor([1, 6, 7])
    maps = viz.collect_attention(tiny_model, src, src_mask, tgt)
    assert tiny_model.training  # mode restored
    assert not any(m.hooks for m in tiny_model.modules() if isinstance(m, MultiHeadedAttention))  # hooks removed
    assert sorted(maps) == ["encoder", "self", "src"]
    for kind, shape in {"encoder": (4, 5, 5), "self": (4, 3, 3), "src": (4, 3, 5)}.items():
        assert len(maps[kind]) == 2
        for a in maps[kind]:
            assert tuple(a.shape) == shape
            assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-5)
    for a in maps["self"]:  # the subsequent mask: nothing above the diagonal
        assert torch.all(a.triu(diagonal=1) == 0)
    for a in maps["encoder"] + maps["src"]:  # the padded source position gets no attention
        assert torch.all(a[..., -1] == 0)


def test_attention_grid_lays_out_the_heads_of_one_layer(tiny_model):
    src_tokens, tgt_tokens = ["ein", "Mann", "und", "ein", "Hund"], ["<s>", "a", "man"]
    with pytest.raises(ValueError, match="keep_attention"):
        viz.attention_grid(tiny_model, 0, "encoder", src_tokens, tgt_tokens)
    maps = viz.collect_attention(tiny_model, torch.tensor([1, 2, 3, 2, 4]), None, torch.tensor([1, 6, 7]))

    spec = viz.attention_grid(tiny_model, 1, "src", src_tokens, tgt_tokens).to_dict()
    assert spec["title"]["text"] == "Decoder-source attention, layer 2 of 2"
    assert [c["title"] for c in spec["concat"]] == ["head 1", "head 2", "head 3", "head 4"]
    for h, chart in enumerate(spec["concat"]):
        assert labels_of(chart["encoding"]["y"]) == tgt_tokens
        assert labels_of(chart["encoding"]["x"]) == src_tokens
        for r in rows(chart):
            assert r["weight"] == pytest.approx(float(maps["src"][1][h, r["row"], r["col"]]), abs=1e-6)

    spec = viz.attention_grid(tiny_model, 0, "self", src_tokens, tgt_tokens, heads=[2, 0]).to_dict()
    assert [c["title"] for c in spec["concat"]] == ["head 3", "head 1"]
    assert labels_of(spec["concat"][0]["encoding"]["x"]) == tgt_tokens

    spec = viz.attention_grid(tiny_model, -1, "encoder", src_tokens, tgt_tokens).to_dict()
    assert spec["title"]["text"] == "Encoder self-attention, layer 2 of 2"
    assert labels_of(spec["concat"][0]["encoding"]["y"]) == src_tokens

    with pytest.raises(ValueError, match="layer 2 does not exist: the model has 2 layers, numbered 0 to 1"):
        viz.attention_grid(tiny_model, 2, "encoder", src_tokens, tgt_tokens)
    with pytest.raises(ValueError, match="heads"):
        viz.attention_grid(tiny_model, 0, "encoder", src_tokens, tgt_tokens, heads=[4])
    with pytest.raises(ValueError, match="kind"):
        viz.attention_grid(tiny_model, 0, "decoder", src_tokens, tgt_tokens)
    with pytest.raises(ValueError, match="does not match"):  # tokens of the wrong sentence
        viz.attention_grid(tiny_model, 0, "encoder", src_tokens[:-1], tgt_tokens)


# --------------------------------------------------------------------------- training curves


def write_metrics(path: Path, bleu: bool) -> None:
    lines = [
        {"kind": "train", "epoch": 1, "step": 10, "loss": 3.0, "lr": 1e-4, "tokens_per_s": 900.0},
        {"kind": "train", "epoch": 1, "step": 20, "loss": 2.0, "lr": 2e-4, "tokens_per_s": 950.0},
        {"kind": "epoch", "epoch": 1, "step": 20, "train_loss": 2.4, "val_loss": 2.2,
         **({"bleu": 5.0} if bleu else {})},
        {"kind": "train", "epoch": 2, "step": 30, "loss": 1.5},  # no lr on this line
        {"kind": "epoch", "epoch": 2, "step": 40, "val_loss": 1.4, **({"bleu": 9.5} if bleu else {})},
    ]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    path.write_text(text + "\n" + '{"kind": "train", "step": 50, "lo', encoding="utf-8")  # blank + torn line


def test_training_curves_chart_reads_metrics_jsonl(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, bleu=True)
    spec = viz.training_curves_chart(path).to_dict()
    loss, lr, bleu = spec["vconcat"]
    assert [c["title"] for c in spec["vconcat"]] == ["Loss", "Learning rate", "BLEU"]
    series = {name: [(p["step"], p["value"]) for p in pts] for name, pts in by(rows(loss), "series").items()}
    assert series == {"train": [(10, 3.0), (20, 2.0), (30, 1.5)], "train (epoch mean)": [(20, 2.4)],
                      "validation": [(20, 2.2), (40, 1.4)]}
    assert [(p["step"], p["value"]) for p in rows(lr)] == [(10, 1e-4), (20, 2e-4)]
    assert lr["encoding"]["y"]["axis"]["format"] == ".2~e"  # 1e-4, not Vega's "0.0001" or, rounded, "0"
    assert "axis" not in loss["encoding"]["y"]  # the loss keeps Vega's own tick labels
    assert [(p["step"], p["value"]) for p in rows(bleu)] == [(20, 5.0), (40, 9.5)]

    write_metrics(path, bleu=False)
    assert [c["title"] for c in viz.training_curves_chart(path).to_dict()["vconcat"]] == ["Loss", "Learning rate"]

    path.write_text('{"kind": "epoch", "epoch": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="no loss"):
        viz.training_curves_chart(path)


def test_one_metrics_reader_for_the_run_and_the_charts(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", bleu=False)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [10, 20, 20, 30, 40]  # the blank and the torn line skipped
    assert RunDir(tmp_path).records() == records
    assert RunDir(tmp_path / "none").records() == []  # a run that has logged nothing yet
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "none" / "metrics.jsonl")


# --------------------------------------------------------------------------- saving


def test_save_chart_writes_offline_html_and_png(tmp_path):
    chart = viz.attention_chart(torch.eye(3), ["a", "b", "a"], ["x", "y", "z"], title="save me")
    options_before = dict(alt.data_transformers.options)
    paths = viz.save_chart(chart, tmp_path / "charts" / "layer.1", scale=1)
    assert paths == [tmp_path / "charts" / "layer.1.html", tmp_path / "charts" / "layer.1.png"]
    html = paths[0].read_text(encoding="utf-8")
    assert "vegaEmbed" in html and '"save me"' in html
    assert "<script src=" not in html.replace(" ", "") and 'src="http' not in html  # nothing fetched
    assert len(html) > 100_000  # the Vega / Vega-Lite / vega-embed bundle itself is inlined
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "charts").iterdir()) == ["layer.1.html", "layer.1.png"]  # no temp files
    assert dict(alt.data_transformers.options) == options_before  # the max-rows lift was scoped
    plain_file = tmp_path / "plain"
    plain_file.write_bytes(b"")
    # permissions follow the umask like any other file (mkstemp's would be private 0600)
    assert stat.S_IMODE(paths[1].stat().st_mode) == stat.S_IMODE(plain_file.stat().st_mode)

    grid_html = viz.save_chart(viz.mask_chart(4), tmp_path / "mask", formats=("html",))
    assert grid_html == [tmp_path / "mask.html"]
    with pytest.raises(ValueError, match="formats"):
        viz.save_chart(chart, tmp_path / "x", formats=("svg",))


def test_every_public_name_is_the_one_its_module_defines():
    """The lazy names (importing the package loads no chart library: test_layout.py checks that in a fresh
    interpreter) resolve to the objects of the modules _MODULE_OF names."""
    import importlib

    assert sorted(viz.__all__) == sorted(viz._MODULE_OF)  # every public name says where it lives
    for name in viz.__all__:
        module = importlib.import_module(f"annotated_transformer.visualization.{viz._MODULE_OF[name]}")
        assert getattr(viz, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_chart'"):
        viz.no_such_chart  # noqa: B018


def test_png_size_reads_the_header():
    png = viz.chart_png(viz.mask_chart(4).to_dict(), scale=1)
    width, height = viz.png_size(png)
    assert 100 < width < 1000 and 100 < height < 1000
    assert viz.png_size(viz.chart_png(viz.mask_chart(4).to_dict(), scale=2)) == (2 * width, 2 * height)
    with pytest.raises(ValueError, match="not a PNG"):
        viz.png_size(b"GIF89a" + bytes(18))


def test_layer_numbers_count_from_one_and_indices_from_zero():
    assert viz.layer_indices(None, 3) == [0, 1, 2]
    assert viz.layer_indices([3, 1, 3], 3) == [0, 2]
    for bad in (0, 4, -1):
        with pytest.raises(UserError, match=f"layer {bad} does not exist: the model has 3 layers, numbered 1 to 3"):
            viz.layer_indices([1, bad], 3)


# --------------------------------------------------------------------------- notebook output


def test_notebook_renderer_gives_interactive_html_and_a_png():
    chart = viz.attention_chart(torch.eye(2), ["</script>", "b"], ["x", "y"], title="in a notebook")
    before = alt.renderers.active
    try:
        viz.enable_notebook_charts()
        data, metadata = chart._repr_mimebundle_()
        viz.enable_notebook_charts(interactive=False)
        png_only, _ = chart._repr_mimebundle_()
    finally:
        alt.renderers.enable(before)
    assert {"text/html", "image/png", "text/plain"} <= set(data) and "text/html" not in png_only
    assert data["image/png"][:8] == b"\x89PNG\r\n\x1a\n"
    width, height = viz.png_size(data["image/png"])
    assert metadata["image/png"] == {"width": width / 2, "height": height / 2}  # shown at its logical size
    html = data["text/html"]
    assert not html.lstrip().startswith("<!DOCTYPE")  # a fragment: many of them share the notebook's page
    assert re.search(r"<script[^>]*\ssrc\s*=", html) is None and "window.vegaEmbed" in html
    # The PNG is inside the HTML too, shown until the chart is drawn or where no script runs.
    fallback = re.search(r'<img src="data:image/png;base64,([^"]+)" width="([0-9.]+)"', html)
    assert base64.b64decode(fallback.group(1)) == data["image/png"] and float(fallback.group(2)) == width / 2
    # A token "</script>" cannot end the script early: its "<" is escaped in the inlined spec.
    assert html.lower().count("</script") == 1


NODE_PAGE = """
const vm = require("vm");
const pieces = JSON.parse(require("fs").readFileSync(0, "utf8"));
const ctx = vm.createContext({console: {log: console.log, warn() {}, error() {}}, setTimeout, clearTimeout,
                              setInterval, clearInterval, queueMicrotask, structuredClone, URL, TextEncoder,
                              TextDecoder, performance, fetch});
vm.runInContext("var window = this;", ctx);
function run(piece) {
  // The script sits right after its chart's element, as in the page.
  ctx.document = {currentScript: {previousElementSibling: {id: piece.id}}, getElementById: (id) => null};
  vm.runInContext(piece.script, ctx);
}
run(pieces[0]);  // loads the inlined bundle, which defines window.vegaEmbed
const loaded = typeof ctx.vegaEmbed;
const calls = [];
ctx.vegaEmbed = (el, spec, opts) => { calls.push([el.id, spec.title, opts]); return Promise.resolve(); };
for (const piece of pieces) run(piece);  // every chart again, on the same page
console.log(JSON.stringify({loaded, calls}));
"""


def test_chart_fragments_share_one_page_and_draw_into_their_own_element():
    """Two charts' scripts in one JavaScript realm, as two outputs of a notebook: no name clashes.

    Altair's "inline" HTML declares top-level constants (and the bundle does too), so a second chart
    on the same page fails with "Identifier has already been declared"; ours keep them local.
    """
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    pieces = []
    for title in ("first", "second"):
        fragment = viz.chart_html(viz.attention_chart(torch.eye(2), ["a", "b"], ["c", "d"], title=title).to_dict(),
                                  page=False)
        element = re.search(r'<div id="([^"]+)">', fragment).group(1)
        scripts = re.findall(r"<script[^>]*>(.*?)</script>", fragment, flags=re.DOTALL)
        assert len(scripts) == 1
        pieces.append({"id": element, "script": scripts[0]})
    assert pieces[0]["id"] != pieces[1]["id"]
    proc = subprocess.run([node, "-e", NODE_PAGE], input=json.dumps(pieces), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["loaded"] == "function"
    assert result["calls"] == [[pieces[0]["id"], "first", {"renderer": "svg"}],
                               [pieces[1]["id"], "second", {"renderer": "svg"}]]


def test_the_vega_script_is_assembled_once_per_version_and_read_back_after(tmp_path, monkeypatch):
    import vl_convert

    from annotated_transformer.visualization import rendering

    calls = []

    def bundle(vl_version=None):
        calls.append(vl_version)
        return f"window.vegaEmbed = function () {{}}; // {len(calls)}"

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundle)
    monkeypatch.setattr(rendering, "SCRIPT_CACHE", tmp_path / "vega")
    rendering._vega_script.cache_clear()
    try:
        first = rendering._vega_script()
        rendering._vega_script.cache_clear()  # a new process: the file is read, vl-convert not asked again
        assert rendering._vega_script() == first and len(calls) == 1 and "// 1" in first
        (kept,) = (tmp_path / "vega").iterdir()
        assert vl_convert.__version__ in kept.name and kept.read_text(encoding="utf-8").endswith("// 1")
        kept.write_text("", encoding="utf-8")  # a copy emptied by something else: made again, and kept again
        rendering._vega_script.cache_clear()
        assert "// 2" in rendering._vega_script() and len(calls) == 2 and kept.read_text().endswith("// 2")
        # a cache folder that cannot be written (a file in its place): the script is made all the same
        monkeypatch.setattr(rendering, "SCRIPT_CACHE", tmp_path / "vega" / kept.name / "below")
        rendering._vega_script.cache_clear()
        assert "// 3" in rendering._vega_script() and len(calls) == 3
    finally:
        rendering._vega_script.cache_clear()
