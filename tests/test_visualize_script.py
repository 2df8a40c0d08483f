"""scripts/visualize.py on a tiny trained checkpoint: the files it writes, what their charts hold, bad input."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import run
from annotated_transformer.checkpoints import load_checkpoint, save_model_file

SENTENCE = "Ein Mann und eine Frau gehen auf der Straße."
# Every word is frequent in Multi30k, so the source labels are the words themselves (no "(unk)").
SOURCE_TOKENS = ["<s>", "Ein", "Mann", "und", "eine", "Frau", "gehen", "auf", "der", "Straße", ".", "</s>"]
TEACHING = ["mask", "positional_encoding", "lr_schedule", "label_smoothing", "loss_penalty", "training_curves"]
ATTENTION = ["attention_layer1_encoder_self", "attention_layer1_decoder_self", "attention_layer1_decoder_src"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chart_spec(html_path: Path) -> dict:
    """The Vega-Lite spec inlined in an HTML file written by save_chart (`const spec = {...};`)."""
    text = html_path.read_text(encoding="utf-8")
    start = text.index("const spec = ") + len("const spec = ")
    spec, _ = json.JSONDecoder().raw_decode(text, start)
    return spec


def axis_labels(encoding: dict) -> list[str]:
    """The tokens printed on a position axis: the JSON array in front of its labelExpr."""
    expr = encoding["axis"]["labelExpr"]
    return json.loads(expr[: -len("[datum.value]")])


def heads(spec: dict) -> list[dict]:
    """The per-head charts of an attention grid."""
    return spec["concat"]


def weight_rows(head: dict) -> dict[int, list[dict]]:
    """A head's records grouped by query row."""
    rows: dict[int, list[dict]] = defaultdict(list)
    for r in head["data"]["values"]:
        rows[r["row"]].append(r)
    return rows


@pytest.fixture(scope="module")
def cli_run(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, command):
    """The command run once, as scripts/visualize.py runs it (in this process): (exit code, stdout, stderr, folder)."""
    out = tmp_path_factory.mktemp("viz")
    code, stdout, stderr = command("visualize", "--checkpoint", tiny_checkpoint, "--sentence", SENTENCE, "--out", out)
    return code, stdout.decode(), stderr.decode(), out


def test_writes_every_chart_as_offline_html_and_png(cli_run):
    code, stdout, stderr, out = cli_run
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("translation: ")
    # The Vega libraries once in the folder (vega + vega-lite + vega-embed bundled), in the list of written files.
    script = out / "vega.js"
    assert str(script) in stdout and script.stat().st_size > 300_000
    assert script.read_text(encoding="utf-8").startswith("(function () {\nif (window.vegaEmbed) return;")
    for stem in ATTENTION + TEACHING:
        html, png = out / f"{stem}.html", out / f"{stem}.png"
        assert str(html) in stdout and str(png) in stdout  # the list of written files
        text = html.read_text(encoding="utf-8")
        assert "vegaEmbed(" in text and "const spec = " in text
        # The page loads the folder's copy by a relative path: nothing is fetched from anywhere else.
        assert re.findall(r"<script[^>]*\ssrc=\"([^\"]*)\"", text) == ["vega.js"]
        assert not re.search(r"<link[^>]*href=", text)
        assert "if (window.vegaEmbed) return;" not in text  # no page carries its own copy of the bundle
        assert png.read_bytes()[:8] == PNG_MAGIC
    index = (out / "index.html").read_text(encoding="utf-8")
    for stem in ATTENTION + TEACHING:
        assert f'href="{stem}.html"' in index and f'src="{stem}.png"' in index
    assert "http" not in index  # plain, local links only


@pytest.mark.slow  # draws every chart twice: the fast tier stays under a minute
def test_a_second_visualize_into_the_folder_needs_overwrite(cli_run, tiny_checkpoint, command):
    out = cli_run[3]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, stdout, stderr = command("visualize", "--checkpoint", tiny_checkpoint, "--sentence", "Eine Frau.",
                                   "--out", out)
    assert code == 2 and stdout == b""
    assert stderr.decode().splitlines() == [f"error: {out / 'index.html'} already exists (a file); choose another "
                                            "--out, or pass --overwrite to replace it"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not one chart replaced


def test_the_charts_of_a_run_are_never_visualizes_out(tiny_checkpoint, tmp_path, command):
    """--out RUN/charts (where training draws its curves) is refused even with --overwrite; RUN/viz is fine."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run)
    (run / "charts").mkdir(exist_ok=True)
    (run / "charts" / "training_curves.html").write_text("the run's curves")
    before = sorted(p.name for p in (run / "charts").iterdir())
    code, stdout, stderr = command("visualize", "--checkpoint", run, "--out", run / "charts", "--overwrite",
                                   "Eine Frau.")
    assert code == 2 and stdout == b"" and stderr.decode().count("\n") == 1
    assert f"--out {run / 'charts'} is a folder of the run or export in {run} " in stderr.decode()
    assert sorted(p.name for p in (run / "charts").iterdir()) == before
    assert (run / "charts" / "training_curves.html").read_text() == "the run's curves"


def test_attention_charts_hold_the_translation_tokens_in_order_and_rows_sum_to_one(cli_run):
    _, stdout, _, out = cli_run
    translation = stdout.splitlines()[0].removeprefix("translation: ")
    target_tokens = ["<s>", *translation.split()]  # word mode: the translation is its tokens joined by spaces
    assert len(target_tokens) <= len(SOURCE_TOKENS) - 2 + 10 + 1  # the fixture's decode.max_len_a=10

    expected_axes = {  # (rows = queries, columns = keys)
        "attention_layer1_encoder_self": (SOURCE_TOKENS, SOURCE_TOKENS),
        "attention_layer1_decoder_self": (target_tokens, target_tokens),
        "attention_layer1_decoder_src": (target_tokens, SOURCE_TOKENS),
    }
    for stem, (queries, keys) in expected_axes.items():
        spec = chart_spec(out / f"{stem}.html")
        assert len(heads(spec)) == 4  # tiny.yaml: h = 4, every head drawn
        for head in heads(spec):
            assert axis_labels(head["encoding"]["y"]) == queries
            assert axis_labels(head["encoding"]["x"]) == keys
            rows = weight_rows(head)
            assert sorted(rows) == list(range(len(queries)))
            for i, row in rows.items():
                assert sorted(r["col"] for r in row) == list(range(len(keys)))
                assert sum(r["weight"] for r in row) == pytest.approx(1.0, abs=1e-4)
                assert {r["query"] for r in row} == {queries[i]}
                assert all(r["key"] == keys[r["col"]] for r in row)
                if stem.endswith("decoder_self"):  # masked: a position never sees a later one
                    assert all(r["weight"] == 0 for r in row if r["col"] > i)


@pytest.mark.slow  # renders every chart, PNGs through vl-convert included
def test_only_the_chosen_layers_and_formats(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    # In-process: the command scripts/visualize.py runs, without paying for another interpreter start.
    with pytest.raises(SystemExit) as exc:
        run("visualize", ["--checkpoint", str(tiny_checkpoint), "--sentence", SENTENCE, "--out", str(tmp_path),
                          "--layers", "1", "--formats", "html"], "visualize.py")
    assert exc.value.code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{s}.html" for s in ATTENTION + TEACHING] + ["index.html", "vega.js"])
    assert "<img" not in (tmp_path / "index.html").read_text(encoding="utf-8")
    with pytest.raises(SystemExit) as exc:  # PNGs alone need no JavaScript
        run("visualize", ["--checkpoint", str(tiny_checkpoint), "--sentence", SENTENCE, "--out", str(tmp_path / "png"),
                          "--layers", "1", "--formats", "png"], "visualize.py")
    assert exc.value.code == 0 and not (tmp_path / "png" / "vega.js").exists()


@pytest.mark.slow  # draws the charts twice: the fast tier stays under a minute
def test_overwrite_leaves_one_sentences_charts_and_your_files(tiny_checkpoint, tmp_path):
    """A second visualize with --overwrite and fewer formats removes the first's charts (those its index.html links)
    that it does not write again (the PNGs of another sentence stayed beside the new HTML); files of yours there
    stay, a chart's name alone too."""
    args = ["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path), "--layers", "1"]
    for more in (["--sentence", SENTENCE], ["--sentence", "Zwei Hunde.", "--overwrite", "--formats", "html"]):
        with pytest.raises(SystemExit) as exc:
            run("visualize", [*args, *more], "visualize.py")
        assert exc.value.code == 0
        if "--overwrite" not in more:  # yours, beside the first charts, before the second visualize
            (tmp_path / "notes.txt").write_text("mine")
            (tmp_path / "mask.png.bak").write_text("mine too")
            (tmp_path / "attention_layer9_encoder_self.png").write_text("named as a chart, linked by no index: mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{s}.html" for s in ATTENTION + TEACHING] + ["index.html", "vega.js", "notes.txt", "mask.png.bak",
                                                       "attention_layer9_encoder_self.png"])
    assert "Zwei" in (tmp_path / f"{ATTENTION[0]}.html").read_text(encoding="utf-8")


def run_in_process(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """Run the script's entry point with `args`; return (exit code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run("visualize", args, "visualize.py")
    return exc.value.code, capsys.readouterr().err


@pytest.fixture()
def copy_task_checkpoint(tiny_checkpoint, tmp_path) -> Path:
    """A checkpoint without a text vocabulary, as the copy task writes."""
    payload = load_checkpoint(tiny_checkpoint)
    payload["text"] = None
    return save_model_file(payload, tmp_path / "copy.safetensors")


@pytest.mark.parametrize("case, message", [
    ("missing", "checkpoint {tmp}/nope.pt not found"),
    ("empty sentence", "sentence is empty"),
    ("layer out of range", "layer 2 does not exist"),
    ("layer zero", "layer 0 does not exist"),
    ("copy task", "without a text vocabulary"),
    ("bad beam", "beam size must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(case, message, tiny_checkpoint, copy_task_checkpoint, tmp_path,
                                          monkeypatch, capsys):
    out = tmp_path / "out"
    base = ["--checkpoint", str(tiny_checkpoint), "--sentence", SENTENCE, "--out", str(out)]
    args = {
        "missing": ["--checkpoint", str(tmp_path / "nope.pt"), "--sentence", SENTENCE, "--out", str(out)],
        "empty sentence": ["--checkpoint", str(tiny_checkpoint), "--sentence", "  ", "--out", str(out)],
        "layer out of range": [*base, "--layers", "1", "2"],
        "layer zero": [*base, "--layers", "0"],
        "copy task": ["--checkpoint", str(copy_task_checkpoint), "--sentence", SENTENCE, "--out", str(out)],
        "bad beam": [*base, "--beam", "0"],
    }[case]
    code, err = run_in_process(args, monkeypatch, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message.format(tmp=tmp_path) in err, err
    assert not out.exists()  # nothing written before the mistake was found


# --------------------------------------------------------------------------- token labels, no data needed

GERMAN = ["ein Hund läuft im Park", "zwei Männer spielen Fußball", "eine Frau liest ein Buch",
          "ein Kind spielt im Schnee", "zwei Hunde laufen am Strand"]
ENGLISH = ["a dog runs in the park", "two men play football", "a woman reads a book",
           "a child plays in the snow", "two dogs run on the beach"]


def make_translator(text, seed: int = 0):
    """A random 2-layer model around `text`, outputs capped at source length + 4 tokens."""
    from annotated_transformer.config import Config
    from annotated_transformer.deploy.translator import Translator
    from annotated_transformer.extensions.builder import build_model

    cfg = Config()
    cfg.model.N, cfg.model.d_model, cfg.model.d_ff, cfg.model.h = 2, 16, 32, 2
    cfg.decode.max_len_a = 4
    torch.manual_seed(seed)
    model = build_model(cfg, len(text.src_vocab), len(text.tgt_vocab))
    return Translator(model, text, cfg, "cpu")


def check_alignment(sa) -> None:
    """Labels match the ids position by position, and every map has their shape."""
    assert len(sa.src_tokens) == len(sa.src_ids) and len(sa.tgt_tokens) == len(sa.tgt_ids)
    assert sa.src_tokens[0] == "<s>" and sa.src_tokens[-1] == "</s>" and sa.tgt_tokens[0] == "<s>"
    S, T = len(sa.src_ids), len(sa.tgt_ids)
    for kind, shape in {"encoder": (S, S), "self": (T, T), "src": (T, S)}.items():
        assert len(sa.attention[kind]) == 2
        for maps in sa.attention[kind]:
            assert tuple(maps.shape[1:]) == shape
            assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)


def test_subword_labels_drop_the_word_marker():
    from annotated_transformer.data.text import TextPipeline
    from annotated_transformer.visualization import SPM_SPACE, display_token, sentence_attention

    text = TextPipeline.for_subwords(GERMAN * 20, ENGLISH * 20, src_lang="de", tgt_lang="en", vocab_size=60)
    sa = sentence_attention(make_translator(text), "zwei Hunde spielen im Park")
    check_alignment(sa)
    pieces = text.tokenize("zwei Hunde spielen im Park", "src")
    assert any(p.startswith(SPM_SPACE) for p in pieces)
    assert sa.src_tokens == ["<s>", *(p.replace(SPM_SPACE, "") or p for p in pieces), "</s>"]
    assert not any(SPM_SPACE in t for t in sa.src_tokens + sa.tgt_tokens if t != SPM_SPACE)
    assert display_token(SPM_SPACE) == SPM_SPACE  # a lone marker stays visible rather than an empty label


@pytest.mark.parametrize("prune", [False, True])
def test_a_merging_model_labels_each_map_with_the_tokens_it_shows(prune):
    from annotated_transformer.extensions.token_merging import with_token_merging
    from annotated_transformer.data.text import TextPipeline
    from annotated_transformer.visualization import sentence_attention, sentence_grid

    text = TextPipeline.for_words([s.split() for s in GERMAN], [s.split() for s in ENGLISH], src_lang="de",
                                  tgt_lang="en", min_freq=1)
    translator = make_translator(text)
    ratios = (0.0, 0.5) if prune else (0.5, 0.0)  # after layer 1 of 2: about half the tokens leave
    translator.model = with_token_merging(translator.model, *ratios, layers=(0,))
    sa = sentence_attention(translator, "ein Hund läuft im Park")
    assert sa.layer_src_tokens[0] == sa.src_tokens  # layer 1 attends before its own merge
    merged = sa.layer_src_tokens[1]
    assert merged == sa.memory_tokens and len(merged) < len(sa.src_tokens)
    assert sa.attention["encoder"][1].shape[-2:] == (len(merged), len(merged))
    assert sa.attention["src"][0].shape[-1] == len(merged)
    parts = [p for label in merged for p in label.split("+")]
    if prune:  # survivors alone, in order; the pruned are gone
        assert parts == merged and [t for t in sa.src_tokens if t in parts] == parts
    else:  # every source token is in exactly one label
        assert sorted(parts) == sorted(sa.src_tokens) and any("+" in label for label in merged)
    spec = sentence_grid(sa, 0, "src").to_dict()
    assert axis_labels(spec["concat"][0]["encoding"]["x"]) == merged


def test_word_labels_name_unknown_words_and_follow_truncation():
    from annotated_transformer.data.text import TextPipeline
    from annotated_transformer.deploy.text_translator import TruncationWarning
    from annotated_transformer.visualization import sentence_attention, sentence_grid

    text = TextPipeline.for_words([s.split() for s in GERMAN], [s.split() for s in ENGLISH], src_lang="de",
                                  tgt_lang="en", min_freq=1, max_sentence_len=6)
    translator = make_translator(text)
    sa = sentence_attention(translator, "ein Zebra läuft")
    check_alignment(sa)
    assert sa.src_tokens == ["<s>", "ein", "Zebra (unk)", "läuft", "</s>"] and not sa.truncated
    assert sa.translation == text.ids_to_text(sa.tgt_ids, "tgt")
    # Longer than max_sentence_len = 6: cut to <s> + 4 words + </s>, as the model saw it, with a warning.
    with pytest.warns(TruncationWarning, match="^1 of 1 sentence was longer than the model's limit of 6 tokens"):
        sa = sentence_attention(translator, "ein Hund läuft im Park am Strand")
    check_alignment(sa)
    assert sa.truncated and sa.src_tokens == ["<s>", "ein", "Hund", "läuft", "im", "</s>"]
    # The grid of each kind draws every head with these labels; layer 2 of 2 is index 1.
    spec = sentence_grid(sa, 1, "src").to_dict()
    assert spec["title"]["text"] == "Decoder-source attention, layer 2 of 2" and len(spec["concat"]) == 2
    assert axis_labels(spec["concat"][0]["encoding"]["x"]) == sa.src_tokens
    assert axis_labels(spec["concat"][0]["encoding"]["y"]) == sa.tgt_tokens
