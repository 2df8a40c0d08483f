"""Translator, the Python API: it loads what the commands' --checkpoint takes, translates a str to a str and a
list (or tuple) of str to a list, refuses anything else with a TypeError, and fails as the commands do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from annotated_transformer import Translator
from annotated_transformer.deploy.translator import resolve_checkpoint
from annotated_transformer.runtime.errors import ConfigError, UserError

SENTENCES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau."]
TAKES = "translate\\(\\) takes a str or a list or tuple of str, got"


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.load(tiny_checkpoint.parent, device="cpu")  # the run directory, as the commands take it


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
    with pytest.raises(ConfigError, match="^beam_size must be at least 1, got 0$"):
        translator.translate("Ein Hund.", beam_size=0)  # never the checkpoint's beam in its place
    with pytest.raises(TypeError, match="^beam_size must be a whole number, got float 2.0$"):
        translator.translate("Ein Hund.", beam_size=2.0)
    with pytest.raises(ConfigError, match="^batch_size must be at least 1, got -1$"):
        translator.translate(["Ein Hund."], batch_size=-1)
    with pytest.raises(ConfigError, match="^alpha must be a number of at least 0, got -0.5$"):
        translator.translate("Ein Hund.", alpha=-0.5)
    with pytest.raises(ConfigError, match="^beam must be at least 1, got 0$"):
        Translator.load(tiny_checkpoint, beam=0)
    with pytest.raises(TypeError, match="^beam must be a whole number, got str '5'$"):
        Translator.load(tiny_checkpoint, beam="5")
    with pytest.raises(ConfigError, match="--quantize must be none, int8 or bf16, got 'fp8'"):
        Translator.load(tiny_checkpoint, quantize="fp8")


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_decodes_as_the_translate_commands_beam(tiny_checkpoint, translator, command, beam):
    run = tiny_checkpoint.parent
    loaded = Translator.load(run, beam=beam, device="cpu")
    assert loaded.config.decode.beam_size == beam  # the checkpoint's setting replaced
    expected = command_lines(command, "--checkpoint", run, "--device", "cpu", "--beam", beam)
    assert loaded.translate(SENTENCES) == expected == translator.translate(SENTENCES, beam_size=beam)
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


def test_an_exported_folder_loads_the_ctranslate2_engine(tiny_checkpoint, tmp_path, command):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is in the dev group: uv sync installs it")
    from annotated_transformer.deploy.ct2_translator import CT2Translator

    folder = tmp_path / "tiny_ct2"
    code, _, err = command("export", "--checkpoint", tiny_checkpoint, "--out", folder)
    assert code == 0, err.decode()
    exported = Translator.load(folder, beam=1)
    assert isinstance(exported, CT2Translator) and exported.config.decode.beam_size == 1
    expected = command_lines(command, "--checkpoint", folder, "--beam", "1")
    assert exported.translate(SENTENCES) == expected and exported.translate(SENTENCES[0]) == expected[0]
    with pytest.raises(TypeError, match=f"{TAKES} bytes"):
        exported.translate(b"Ein Hund.")
    with pytest.raises(ConfigError, match="is an exported model folder: load it with Translator.load"):
        Translator.from_checkpoint(folder)
