"""Translator, the Python API: it loads what the commands' --checkpoint takes, translates a str to a str and a
list (or tuple) of str to a list, refuses anything else with a TypeError, and fails as the commands do; n-best
lists with scores, attention maps and a warning for cut input, as the docs show them."""

from __future__ import annotations

import importlib
import math
import re
import warnings
from pathlib import Path

import pytest
import torch

from annotated_transformer import Translator
from annotated_transformer.deploy.text_translator import Hypothesis, TruncationWarning
from annotated_transformer.deploy.translator import resolve_checkpoint
from annotated_transformer.runtime.errors import ConfigError, DataError, UserError

ROOT = Path(__file__).resolve().parents[1]

SENTENCES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau."]
TAKES = "translate\\(\\) takes a str or a list or tuple of str, got"


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.load(tiny_checkpoint.parent, device="cpu")  # the run directory, as the commands take it


@pytest.fixture(scope="module")
def exported(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, command) -> Path:
    """The tiny checkpoint exported for CTranslate2 (skipped where ctranslate2 is missing)."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is in the dev group: uv sync installs it")
    folder = tmp_path_factory.mktemp("exported") / "tiny_ct2"
    code, _, err = command("export", "--checkpoint", tiny_checkpoint, "--out", folder)
    assert code == 0, err.decode()
    return folder


def command_lines(command, *args) -> list[str]:
    """What `translate ARGS` prints for SENTENCES on its standard input, one line each."""
    code, out, err = command("translate", *args, stdin="\n".join(SENTENCES).encode("utf-8") + b"\n")
    assert code == 0, err.decode()
    return out.decode("utf-8").split("\n")[:-1]


def test_a_run_directory_and_its_weights_give_the_same_translator(tiny_checkpoint, translator):
    from_file = Translator.load(tiny_checkpoint, device="cpu")
    old_name = Translator.from_checkpoint(tiny_checkpoint.parent, device="cpu")  # a run directory here too
    assert type(translator) is type(from_file) is type(old_name) is Translator
    assert translator.checkpoint == old_name.checkpoint == resolve_checkpoint(tiny_checkpoint.parent)[1]
    assert from_file.checkpoint == tiny_checkpoint
    outputs = translator.translate(SENTENCES)
    assert outputs == from_file.translate(SENTENCES) == old_name.translate(SENTENCES)


def test_a_str_gives_a_str_and_a_list_or_tuple_a_list(translator):
    one = translator.translate("Ein Hund läuft.")
    assert isinstance(one, str) and one == translator.translate(["Ein Hund läuft."])[0]
    outputs = translator.translate(SENTENCES)
    assert isinstance(outputs, list) and len(outputs) == len(SENTENCES) and all(isinstance(t, str) for t in outputs)
    assert translator.translate(tuple(SENTENCES)) == outputs
    assert translator.translate(SENTENCES[0]) == outputs[0]
    assert translator.translate([]) == [] and translator.translate(()) == []
    assert translator.translate("  ") == "" and outputs[1] == ""


@pytest.mark.parametrize(("given", "message"), [
    (b"Ein Hund.", f"{TAKES} bytes: decode it first"),
    (42, f"{TAKES} int$"),
    (None, f"{TAKES} NoneType$"),
    ({"Ein Hund."}, f"{TAKES} set$"),
    ((s for s in SENTENCES), f"{TAKES} generator; wrap it in list"),
    (["Ein Hund.", 3], f"{TAKES} a list whose item 1 is int$"),
    (("Ein Hund.", b"Eine Katze."), f"{TAKES} a tuple whose item 1 is bytes$"),
])
def test_anything_else_is_a_type_error_naming_it(translator, given, message):
    with pytest.raises(TypeError, match=message):
        translator.translate(given)


def test_decoding_settings_are_checked(translator, tiny_checkpoint):
    with pytest.raises(ConfigError, match="^beam must be at least 1, got 0$"):
        translator.translate("Ein Hund.", beam=0)  # never the checkpoint's beam in its place
    with pytest.raises(TypeError, match="^beam must be a whole number, got float 2.0$"):
        translator.translate("Ein Hund.", beam=2.0)
    with pytest.raises(ConfigError, match="^batch_size must be at least 1, got -1$"):
        translator.translate(["Ein Hund."], batch_size=-1)
    with pytest.raises(ConfigError, match="^alpha must be a number of at least 0, got -0.5$"):
        translator.translate("Ein Hund.", alpha=-0.5)
    with pytest.raises(ConfigError, match="^beam must be at least 1, got 0$"):
        Translator.load(tiny_checkpoint, beam=0)
    with pytest.raises(TypeError, match="^beam must be a whole number, got str '5'$"):
        Translator.load(tiny_checkpoint, beam="5")
    with pytest.raises(ConfigError, match=r"quantize \(--quantize\) must be none, int8 or bf16, got 'fp8'"):
        Translator.load(tiny_checkpoint, quantize="fp8")


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_decodes_as_the_translate_commands_beam(tiny_checkpoint, translator, command, beam):
    run = tiny_checkpoint.parent
    loaded = Translator.load(run, beam=beam, device="cpu")
    assert loaded.config.decode.beam_size == beam  # the checkpoint's setting replaced
    expected = command_lines(command, "--checkpoint", run, "--device", "cpu", "--beam", beam)
    assert loaded.translate(SENTENCES) == expected == translator.translate(SENTENCES, beam=beam)
    assert loaded.translate(SENTENCES[0]) == expected[0]


@pytest.mark.parametrize("where", ["missing.pt", "missing_run", "empty_folder"])
def test_a_wrong_path_is_the_commands_one_line(tmp_path, command, where):
    path = tmp_path / where
    if where == "empty_folder":
        path.mkdir()
    with pytest.raises(UserError) as caught:
        Translator.load(path, device="cpu")
    message = str(caught.value)
    code, out, err = command("translate", "--checkpoint", path, "--device", "cpu", "Ein Mann.")
    assert code == 2 and out == b"" and err.decode() == f"error: {message}\n"
    assert "\n" not in message and str(path) in message
    with pytest.raises(type(caught.value), match=f"^{re.escape(message)}$"):
        Translator.from_checkpoint(path, device="cpu")


def test_an_exported_folder_loads_the_ctranslate2_engine(exported, command):
    from annotated_transformer.deploy.ct2_translator import CT2Translator

    folder = exported
    exported = Translator.load(folder, beam=1)
    assert isinstance(exported, CT2Translator) and exported.config.decode.beam_size == 1
    expected = command_lines(command, "--checkpoint", folder, "--beam", "1")
    assert exported.translate(SENTENCES) == expected and exported.translate(SENTENCES[0]) == expected[0]
    with pytest.raises(TypeError, match=f"{TAKES} bytes"):
        exported.translate(b"Ein Hund.")
    with pytest.raises(ConfigError, match="is an exported model folder: load it with Translator.load"):
        Translator.from_checkpoint(folder)


# ---------------------------------------------------------------- beam, n-best lists, attention, cut input


def test_beam_is_translates_option_and_beam_size_its_older_name(translator):
    with_beam = translator.translate(SENTENCES, beam=3)
    assert translator.translate(SENTENCES, 3) == with_beam  # the second argument, as before
    with pytest.warns(DeprecationWarning, match=r"^translate\(beam_size=...\) is now translate\(beam=...\)$"):
        assert translator.translate(SENTENCES, beam_size=3) == with_beam
    with pytest.raises(TypeError, match="both beam and beam_size"):
        translator.translate("Ein Hund.", beam=3, beam_size=3)


@pytest.mark.parametrize(("beam", "n"), [(4, 3), (1, 1)])
def test_n_best_gives_each_sentences_best_translations_with_their_scores(translator, beam, n):
    best = translator.translate(SENTENCES, beam=beam)
    lists = translator.translate(SENTENCES, beam=beam, n_best=n)
    assert len(lists) == len(SENTENCES)
    for sentence, one, found in zip(SENTENCES, best, lists):
        assert all(isinstance(h, Hypothesis) for h in found)
        if not sentence.strip():
            assert found == [Hypothesis("", 0.0, [])]
            continue
        assert len(found) == n and found[0].text == one  # the first is the translation without n_best
        scores = [h.score for h in found]
        assert all(math.isfinite(s) and s <= 0 for s in scores) and scores == sorted(scores, reverse=True)
        assert all(" ".join(h.tokens) == h.text for h in found)  # word mode: the text is its tokens
        assert len({tuple(h.tokens) for h in found}) == n
    one = translator.translate(SENTENCES[0], beam=beam, n_best=n)  # a str gives one list (decoded alone)
    assert [h.text for h in one] == [h.text for h in lists[0]]
    assert [h.score for h in one] == pytest.approx([h.score for h in lists[0]], abs=1e-4)


def test_n_best_is_at_most_the_beam(translator):
    with pytest.raises(ConfigError, match=r"^n_best \(3\) cannot exceed the beam \(2\): pass beam=3 or more$"):
        translator.translate("Ein Hund.", beam=2, n_best=3)
    with pytest.raises(ConfigError, match="^n_best must be at least 1, got 0$"):
        translator.translate("Ein Hund.", n_best=0)


def test_attention_gives_every_map_of_the_translation_labelled_by_its_tokens(translator):
    sentence, cfg = SENTENCES[2], translator.config.model
    sa = translator.attention(sentence)
    assert sa.translation == translator.translate(sentence) and not sa.truncated
    assert sa.src_tokens[0] == "<s>" and sa.src_tokens[-1] == "</s>" and sa.tgt_tokens[0] == "<s>"
    assert len(sa.src_tokens) == len(sa.src_ids) and len(sa.tgt_tokens) == len(sa.tgt_ids)
    shapes = {"encoder": (len(sa.src_tokens),) * 2, "self": (len(sa.tgt_tokens),) * 2,
              "src": (len(sa.tgt_tokens), len(sa.src_tokens))}
    for kind, shape in shapes.items():
        assert len(sa.attention[kind]) == cfg.N
        for layer, maps in enumerate(sa.attention[kind]):
            assert maps.shape == (cfg.h, *shape) and tuple(map(len, sa.labels(layer, kind))) == shape
            assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)  # each row: weights
    assert translator.attention(sentence, beam=3).translation == translator.translate(sentence, beam=3)
    with pytest.raises(DataError, match="^the sentence is empty"):
        translator.attention("  ")


def test_a_sentence_longer_than_the_limit_is_cut_with_one_warning_a_call(translator):
    limit = translator.text.max_sentence_len
    long = " ".join(["Hund"] * (limit + 5))
    with pytest.warns(TruncationWarning) as caught:
        translator.translate([long, "Ein Mann.", long])
    cut = [w for w in caught if w.category is TruncationWarning]
    assert len(cut) == 1 and cut[0].filename == __file__  # the warning names the caller's line
    assert str(cut[0].message) == (f"2 of 3 sentences were longer than the model's limit of {limit} tokens "
                                   "(data.max_sentence_len, <s> and </s> included) and were cut to it")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncationWarning)
        translator.translate(["Ein Mann.", "Eine Frau."])  # nothing cut, no warning
    with pytest.warns(TruncationWarning, match="^1 of 1 sentence was longer"):
        sa = translator.attention(long)
    assert sa.truncated and len(sa.src_ids) == limit


def test_an_exported_folder_gives_n_best_lists_with_the_engines_scores(exported, translator):
    tr = Translator.load(exported, beam=3)
    best, lists = tr.translate(SENTENCES), tr.translate(SENTENCES, n_best=2)
    for sentence, one, found in zip(SENTENCES, best, lists):
        if not sentence.strip():
            assert found == [Hypothesis("", 0.0, [])]
            continue
        scores = [h.score for h in found]
        assert len(found) == 2 and found[0].text == one and len({h.text for h in found}) == 2
        assert all(math.isfinite(s) and s <= 0 for s in scores) and scores == sorted(scores, reverse=True)
    # Greedy search is the same computation in both engines; without a length penalty, the same score too.
    [engine] = tr.translate(SENTENCES[0], beam=1, alpha=0, n_best=1)
    [ours] = translator.translate(SENTENCES[0], beam=1, alpha=0, n_best=1)
    assert engine.text == ours.text and engine.score == pytest.approx(ours.score, abs=1e-3)
    with pytest.raises(ConfigError, match="^attention maps need the PyTorch model"):
        tr.attention(SENTENCES[0])


def test_the_docs_python_example_runs(tiny_checkpoint, capsys):
    page = (ROOT / "docs" / "translating.md").read_text(encoding="utf-8")
    code = page.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "n_best=3" in code and "tr.attention(" in code
    exec(compile(code.replace("runs/cpu_15min", str(tiny_checkpoint.parent)), "translating.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and all(re.match(r"-\d+\.\d{3}  ", line) for line in printed[:3])


def test_the_errors_are_importable_from_where_the_docs_say():
    page = (ROOT / "docs" / "translating.md").read_text(encoding="utf-8")
    named = re.search(r"`UserError`.*?from\s+`(annotated_transformer[\w.]*)`", page, re.DOTALL)
    module = importlib.import_module(named.group(1))
    assert module.UserError is UserError and issubclass(module.ConfigError, module.UserError)
