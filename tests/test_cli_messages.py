"""A command-line mistake is one line that names what is wrong and how to fix it, in every command; and an option
takes the same values, with the same default, wherever it appears."""

from __future__ import annotations

import ast
import zipfile
from importlib import import_module
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import COMMANDS, command_name, main as cli_main
from annotated_transformer.config import load_config
from annotated_transformer.config.loading import closest_key
from annotated_transformer.runtime.errors import ConfigError, excerpt
from annotated_transformer.checkpoints import load_checkpoint, not_a_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def parser_of(command: str):
    return import_module(f"annotated_transformer.cli.{COMMANDS[command_name(command)][0]}").build_parser(command)


def one_error(command, *args, stdin: bytes = b"") -> str:
    """Run a command that must fail: exit 2, nothing on stdout, one `error: ...` line on stderr; that line."""
    code, stdout, stderr = command(*args, stdin=stdin)
    lines = stderr.decode().splitlines()
    assert code == 2 and stdout == b"" and len(lines) == 1 and lines[0].startswith("error: "), (code, stderr)
    return lines[0].removeprefix("error: ")


# ---------------------------------------------------------------- a --checkpoint that is no checkpoint


def test_a_file_of_the_run_is_named_for_what_it_is(tmp_path, command):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "epoch"}\n')
    (run / "config.yaml").write_text("model:\n  N: 2\n")
    for name, kind in (("config.yaml", "a YAML file"), ("metrics.jsonl", "a JSON-lines file")):
        line = one_error(command, "translate", "--checkpoint", run / name, "--device", "cpu", "Ein Mann.")
        assert line == f"{run / name} is {kind}, not a checkpoint: pass the run directory {run} or one of its " \
                       "checkpoint files"


@pytest.mark.parametrize("name, content, kind", [
    ("settings", b"model:\n  N: 2\n", "a text file"),
    ("weights.pt", b'{"model": 1}', "a JSON file"),
    ("weights.pt", b"", "an empty file (0 bytes)"),
    ("weights.pt", b"\x1f\x8b\x08\x00" + bytes(20), "a gzip file"),
    ("weights.pt", bytes(range(200, 256)) * 4, "a file of another format"),
    ("notes.txt", "Straße\n".encode(), "a text file"),
])
def test_what_a_file_is_comes_from_its_first_bytes_and_name(tmp_path, name, content, kind, command):
    path = tmp_path / name
    path.write_bytes(content)
    assert not_a_checkpoint(path) == kind
    line = one_error(command, "export", "--checkpoint", path, "--out", tmp_path / "out")
    assert line == f"{path} is {kind}, not a checkpoint: pass a run directory or a checkpoint file written by training"
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_is_a_device_or_an_exports_file_is_named_for_what_it_is(tmp_path, command):
    """/dev/null was "not found"; an exported folder's config.json was told to pass a run directory."""
    import os

    assert one_error(command, "export", "--checkpoint", os.devnull, "--out", tmp_path / "out") == (
        f"checkpoint {os.devnull} is not a file (a device, pipe or socket); name a .safetensors or .pt file written "
        "by training")
    export = tmp_path / "exported"
    export.mkdir()
    (export / "model.bin").write_bytes(b"\0" * 64)
    (export / "config.json").write_text('{"add_source_bos": true}')
    assert one_error(command, "export", "--checkpoint", export / "config.json", "--out", tmp_path / "out") == (
        f"{export / 'config.json'} is a JSON file, not a model file: pass the exported model folder {export} "
        "(translate and evaluate take it), or a checkpoint file")
    assert not (tmp_path / "out").exists()


def test_a_zip_archive_is_a_checkpoint_only_with_torch_inside(tmp_path):
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as archive:
        archive.writestr("readme.txt", "not weights")
    assert not_a_checkpoint(tmp_path / "other.pt") == "a zip archive"
    torch.save({"w": torch.ones(2)}, tmp_path / "torch.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert not_a_checkpoint(tmp_path / "torch.pt") is None and not_a_checkpoint(tmp_path / "legacy.pt") is None


class Unsafe:
    """An object torch.load(weights_only=True) refuses to rebuild."""


def test_a_checkpoint_that_needs_unpickling_names_the_object_in_whole_words(tmp_path):
    torch.save({"model": Unsafe()}, tmp_path / "unsafe.pt")
    with pytest.raises(Exception) as err:
        load_checkpoint(tmp_path / "unsafe.pt")
    assert str(err.value) == (f"checkpoint {tmp_path / 'unsafe.pt'} needs arbitrary unpickling, which is refused for "
                              f"safety (it holds a {__name__}.Unsafe object); re-save it as a plain dict of tensors")


def test_an_excerpt_ends_between_words():
    text = "Weights only load failed. " * 20
    short = excerpt(RuntimeError(f"\n  {text}\nsecond line"), limit=60)
    assert short == "Weights only load failed. Weights only load failed. Weights ..."
    assert excerpt(ValueError()) == "ValueError" and excerpt("one line") == "one line"


# ---------------------------------------------------------------- configs and config keys


def test_an_unknown_config_suggests_the_nearest_and_lists_the_configs_a_line_each(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = command("train", "--config", "cpu15min")
    lines = stderr.decode().splitlines()
    assert code == 2 and stdout == b""
    assert lines[0] == ("error: config file 'cpu15min' not found (did you mean cpu_15min.yaml?); give a config's name "
                        "(listed below) or a path to a YAML file")
    assert lines[1] == "the shipped configs:"
    assert [line.split()[0] for line in lines[2:]][:3] == ["copy", "tiny", "cpu_15min"]
    assert all(line.startswith("  ") for line in lines[2:]) and not any(tmp_path.iterdir())


@pytest.mark.parametrize("text, what", [
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("- model\n- train\n", "the top level must be a mapping of sections (model:, data:, train:, ...), not a list"),
    ("just words\n", "not a str"),
])
def test_an_empty_or_flat_config_file_is_refused(tmp_path, monkeypatch, text, what, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(text)
    line = one_error(command, "train", "--config", "mine.yaml")
    assert line.startswith("mine.yaml") and what in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]  # no run directory: nothing trained


@pytest.mark.parametrize("key, meant", [
    ("train.lr", "train.lr_factor"),  # the start of a key's last part
    ("train.warmup_steps", "train.warmup"),  # a key's last part inside the given one
    ("train.smoothing", "train.label_smoothing"),  # the given part inside a key's
    ("trian.epochs", "train.epochs"),  # the same last part in another section
    ("train.batch_tokens", "data.batch_tokens"),
    ("model.d_modle", "model.d_model"),  # a typo
    ("train.epcohs", "train.epochs"),
])
def test_a_mistyped_key_suggests_the_key_meant(key, meant):
    from annotated_transformer.config import all_keys

    assert closest_key(key, all_keys()) == meant
    with pytest.raises(ConfigError, match=rf"unknown config key '{key}' \(did you mean '{meant}'\?\)"):
        load_config("copy", [f"{key}=1"])


@pytest.mark.parametrize("args", [
    ("train", "--config", "copy", "train.lr=2"),
    ("prepare-data", "--config", "copy", "train.lr=2"),
    ("benchmark", "--config", "copy", "train.lr=2"),
    ("sweep", "--config", "copy", "train.lr=2"),
    ("evaluate", "--checkpoint", "nowhere", "train.lr=2"),
])
def test_every_command_suggests_the_same_key_for_a_dotted_override(args, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error(command, *args)
    assert line.endswith("unknown config key 'train.lr' (did you mean 'train.lr_factor'?)"), line
    assert not any(tmp_path.iterdir())


def test_a_sweep_grid_key_suggests_the_key_meant(command, tmp_path):
    (tmp_path / "grid.yaml").write_text("train.lr: [0.5, 1.0]\n")
    line = one_error(command, "sweep", "--config", "copy", "--grid", tmp_path / "grid.yaml", "--out", tmp_path / "sw")
    assert line == "setting train.lr=0.5: unknown config key 'train.lr' (did you mean 'train.lr_factor'?)"
    assert not (tmp_path / "sw").exists()


# ---------------------------------------------------------------- unknown options and commands


@pytest.mark.parametrize("args, message", [
    (("train", "--config", "copy", "--epochs", "2"),
     "unknown option --epochs; train.epochs is a config key: use the override train.epochs=2"),
    (("train", "--config", "copy", "--max-steps=5"),
     "unknown option --max-steps; train.max_steps is a config key: use the override train.max_steps=5"),
    (("train", "--config", "copy", "--lr", "2"), "unknown option --lr (did you mean the override train.lr_factor=2?)"),
    (("train", "--config", "copy", "--devices", "cpu"), "unknown option --devices (did you mean --device?)"),
    (("benchmark", "--config", "tiny", "--epochs", "2"),
     "unknown option --epochs; train.epochs is a config key: use the override train.epochs=2"),
    (("prepare-data", "--config", "tiny", "--root", "/data"),
     "unknown option --root; data.root is a config key: use the override data.root=/data"),
    (("sweep", "--config", "copy", "--parralel", "2"), "unknown option --parralel (did you mean --parallel?)"),
    (("evaluate", "--checkpoint", "r", "--root", "/data"),
     "unknown option --root; data.root is a config key: use the override data.root=/data"),
    (("translate", "--checkpoint", "r", "--beam-size", "5"), "unknown option --beam-size (did you mean --beam?)"),
    (("export", "--checkpoint", "r", "--out", "o", "--quantise", "int8"),
     "unknown option --quantise (did you mean --quantize?)"),
    (("visualize", "--checkpoint", "r", "--fromats", "png"), "unknown option --fromats (did you mean --formats?)"),
    (("average-checkpoints", "a.pt", "--outdir", "avg"), "unknown option --outdir (did you mean --out?)"),
    (("translate", "--checkpoint", "r", "--epochs", "2"),  # translate takes no overrides: no override suggested
     "unknown option --epochs; scripts/translate.py --help lists the options"),
    (("export", "--checkpoint", "r", "--out", "o", "stray"),
     "unexpected argument 'stray'; scripts/export.py --help lists the options"),
])
def test_an_unknown_option_suggests_the_option_or_override_meant(args, message, command):
    assert one_error(command, *args) == message


def test_argparse_mistakes_are_one_line_too(command):
    assert one_error(command, "translate", "--beam", "two") == ("argument --beam: invalid int value: 'two' "
                                                                "(scripts/translate.py --help lists the options)")
    assert one_error(command, "export", "--out", "o") == ("the following arguments are required: --checkpoint "
                                                          "(scripts/export.py --help lists the options)")
    assert one_error(command, "visualize", "--checkpoint", "r", "--layers", "1,x", "Ein") == (
        "argument --layers: 'x' is not a whole number (the list is written A,B,C) (scripts/visualize.py --help lists "
        "the options)")
    assert one_error(command, "sweep", "--config", "copy", "--seed-list", "1,,2") == (
        "argument --seed-list: '1,,2' has an empty item; write the list as A,B,C (scripts/sweep.py --help lists the "
        "options)")


def test_an_option_of_one_value_given_twice_is_refused(command):
    """argparse would keep the last one silently: a second --config trained another task into another folder."""
    twice = "is given twice, and only one value is read; give it once"
    assert one_error(command, "train", "--config", "tiny", "--config", "copy") == f"--config {twice}"
    assert one_error(command, "translate", "--checkpoint", "a", "--checkpoint=b", "x") == f"--checkpoint {twice}"
    assert one_error(command, "average-checkpoints", "a", "--output", "a", "--out", "b") == f"--out {twice}"
    assert one_error(command, "sweep", "--config", "copy", "--seed-list", "1,2,1") == (
        "--seed-list names seed 1 twice; its runs would share one folder: give each seed once")


def test_under_torchrun_a_bad_command_line_is_said_once_a_machine(command, monkeypatch):
    """Every rank reads the same command line: the first of each machine says what is wrong (each rank said it)."""
    for args in (("train", "--config", "tiny", "--out", "a", "--out", "b"),
                 ("train", "--config", "tiny", "--outdir", "a"), ("train", "--config", "tiny", "--quiet=x")):
        monkeypatch.setenv("LOCAL_RANK", "1")
        assert command(*args) == (2, b"", b"")
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert one_error(command, *args)


def test_an_unknown_command_suggests_the_nearest(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["trian", "--config", "copy"])
    lines = capsys.readouterr().err.splitlines()
    assert done.value.code == 2 and len(lines) == 1
    assert lines[0].startswith("error: unknown command 'trian' (did you mean train?); the commands are: train, ")


# ---------------------------------------------------------------- one vocabulary


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
def test_quantize_takes_one_vocabulary_with_one_default(command):
    action = next(a for a in parser_of(command)._actions if a.dest == "quantize")
    assert tuple(action.choices) == ("none", "int8", "bf16") and action.default == "none"


@pytest.mark.parametrize("old, new", [("float32", "none"), ("int8_float32", "int8"), ("int8", "int8"),
                                      ("bf16", "bf16")])
def test_export_reads_its_older_quantize_values(old, new, capsys):
    args = parser_of("export").parse_args(["--checkpoint", "r", "--out", "o", "--quantize", old])
    assert args.quantize == new
    note = capsys.readouterr().err
    assert note == ("" if old == new else f"note: --quantize {old} is now spelled --quantize {new}\n")


def test_export_maps_the_vocabulary_onto_ctranslate2s_weight_types():
    from annotated_transformer.cli.export import CT2_WEIGHTS
    from annotated_transformer.cli.options import QUANTIZE
    from annotated_transformer.deploy.ct2_export import QUANTIZATIONS

    assert set(CT2_WEIGHTS) == set(QUANTIZE) and set(CT2_WEIGHTS.values()) <= set(QUANTIZATIONS)
    assert CT2_WEIGHTS == {"none": "float32", "int8": "int8", "bf16": "bfloat16"}



# ---------------------------------------------------------------- export's --out (refused before any conversion:
# these run without ctranslate2)


@pytest.mark.parametrize("where", ["run", "inside", "around"])
@pytest.mark.parametrize("named", ["run", "file"])
def test_export_never_writes_into_the_run_it_reads(tiny_checkpoint, command, where, named):
    run = tiny_checkpoint.parent
    out = {"run": run, "inside": run / "ct2", "around": run.parent}[where]
    checkpoint = run if named == "run" else tiny_checkpoint
    before = sorted(p.name for p in run.iterdir())
    what = {"run": "is the run folder", "inside": "is inside the run folder", "around": "holds the run folder"}[where]
    line = one_error(command, "export", "--checkpoint", checkpoint, "--out", out, "--overwrite")
    assert line == (f"--out {out} {what} {run} whose weights export reads; export never writes into a run, not even "
                    "with --overwrite: choose an --out outside it")
    assert sorted(p.name for p in run.iterdir()) == before


def test_export_refuses_a_folder_it_did_not_write_even_with_overwrite(tiny_checkpoint, tmp_path, command):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert one_error(command, "export", "--checkpoint", tiny_checkpoint, "--out", mine) == (
        f"{mine} already exists (a folder); choose another --out, or pass --overwrite to replace it")
    assert one_error(command, "export", "--checkpoint", tiny_checkpoint, "--out", mine, "--overwrite") == (
        f"{mine} is not a folder written by export (no model.bin, config.json and config.yaml) and may hold your "
        "files; --overwrite replaces only an earlier export: choose another --out")
    looks_exported = tmp_path / "ct2"
    looks_exported.mkdir()
    for name in ("model.bin", "config.json", "config.yaml", "notes.txt"):
        (looks_exported / name).write_text("keep me")
    # --force: the older spelling of --overwrite
    assert one_error(command, "export", "--checkpoint", tiny_checkpoint, "--out", looks_exported, "--force") == (
        f"{looks_exported} holds notes.txt, which export did not write; --overwrite replaces only an earlier export: "
        "move it out of the folder, or choose another --out")
    (looks_exported / "notes.txt").unlink()
    (looks_exported / "vocab").mkdir()  # an earlier export's vocab/ with the user's notes in it: never deleted
    (looks_exported / "vocab" / "notes.txt").write_text("keep me")
    assert one_error(command, "export", "--checkpoint", tiny_checkpoint, "--out", looks_exported, "--overwrite") == (
        f"{looks_exported} holds vocab/notes.txt, which export did not write; --overwrite replaces only an earlier "
        "export: move it out of the folder, or choose another --out")
    assert all(p.read_text() == "keep me" for folder in (mine, looks_exported) for p in folder.rglob("*")
               if p.is_file())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "mine"]  # nothing beside them either


def test_export_bf16_writes_bf16_weights(tiny_checkpoint, tmp_path, command):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is in the dev group: uv sync installs it")
    sizes = {}
    for quantize in ("none", "bf16"):
        out = tmp_path / quantize
        code, stdout, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out, "--quantize", quantize)
        assert code == 0, stderr.decode()
        sizes[quantize] = (out / "model.bin").stat().st_size
    assert "(CTranslate2, bfloat16 weights" in stdout.decode()
    assert 0.4 < sizes["bf16"] / sizes["none"] < 0.6  # two bytes a weight instead of four


@pytest.mark.parametrize("command", ["translate", "evaluate", "visualize"])
def test_beam_defaults_to_the_checkpoints_setting(command):
    action = next(a for a in parser_of(command)._actions if a.dest == "beam")
    assert action.default is None and "the checkpoint's decode.beam_size" in action.help


def test_visualize_takes_the_sentence_as_translate_does(monkeypatch, command, tmp_path):
    import annotated_transformer.deploy.translator as translator
    import annotated_transformer.visualization as visualization

    seen = []

    def record(path, sentence, out, **kwargs):
        seen.append((sentence, kwargs["beam_size"]))
        raise ConfigError("stop here")

    monkeypatch.setattr(visualization, "visualize_checkpoint", record)
    monkeypatch.setattr(translator, "torch_checkpoint", lambda given, what: Path(given))
    for args in (["Ein", "Mann", "fährt."], ["--sentence", "Ein Mann fährt."]):
        assert one_error(command, "visualize", "--checkpoint", "r", "--out", tmp_path / "viz", *args) == "stop here"
    assert seen == [("Ein Mann fährt.", None)] * 2  # None: the checkpoint's beam, as in translate
    assert one_error(command, "visualize", "--checkpoint", "r", "Ein", "--sentence", "Mann") == \
        "give the sentence as arguments or with --sentence, not both"
    assert one_error(command, "visualize", "--checkpoint", "r", "Ein Hund.", "Eine Katze.") == (
        "visualize charts one sentence, and 'Ein Hund.' came with 1 more argument(s); quote the sentence as one "
        "argument")
    assert len(seen) == 2  # refused before anything was charted
    assert one_error(command, "visualize", "--checkpoint", "r", "Dr.", "Müller", "kommt.") == "stop here"
    assert seen[-1] == ("Dr. Müller kommt.", None)  # words alone are one sentence, whatever ends them


def test_visualize_decodes_with_the_checkpoints_beam(tiny_checkpoint, tmp_path, monkeypatch):
    from annotated_transformer.checkpoints import save_checkpoint
    from annotated_transformer.visualization import sentence_page

    payload = load_checkpoint(tiny_checkpoint)
    payload["config"]["decode"]["beam_size"] = 3
    save_checkpoint({k: v for k, v in payload.items() if k not in ("format", "tied")}, tmp_path / "beam3.pt")
    beams = []
    monkeypatch.setattr(sentence_page, "visualize_sentence", lambda tr, s, out, layers, beam, *rest: beams.append(beam))
    sentence_page.visualize_checkpoint(tmp_path / "beam3.pt", "Ein Mann.", tmp_path / "viz", device="cpu")
    sentence_page.visualize_checkpoint(tmp_path / "beam3.pt", "Ein Mann.", tmp_path / "viz", beam_size=1, device="cpu")
    assert beams == [3, 1]


def test_data_root_is_an_override_in_evaluate_and_sweep(monkeypatch, command, tmp_path):
    from annotated_transformer.cli.options import data_root
    from annotated_transformer.lab import sweep

    parser = parser_of("evaluate")
    assert data_root(parser.parse_args(["--checkpoint", "r", "data.root=/a"]), "evaluate") == "/a"
    assert data_root(parser.parse_args(["--checkpoint", "r", "--data-root", "/b"]), "evaluate") == "/b"
    assert data_root(parser.parse_args(["--checkpoint", "r"]), "evaluate") is None  # the checkpoint's own
    assert one_error(command, "evaluate", "--checkpoint", "r", "train.epochs=2") == \
        "evaluate takes only the override data.root=DIR; train.epochs comes from the checkpoint"
    calls = []
    monkeypatch.setattr(sweep, "sweep", lambda config, settings, seeds, out, train, extra, parallel, score, root:
                        calls.append((extra, root)) or 0)
    for args in (["--data-root", "/c"], ["data.root=/d"], ["--data-root", "/c", "data.root=/d"]):
        code, _, stderr = command("sweep", "--config", "copy", "--out", tmp_path / "sw", *args)
        assert code == 0, stderr.decode()
    assert calls == [(("data.root=/c",), "/c"), (("data.root=/d",), "/d"), (("data.root=/c", "data.root=/d"), "/d")]
    assert "--data-root" not in parser.format_help() and "data.root=DIR" in parser.format_help()


@pytest.mark.parametrize("command, required", [
    ("translate", ["--checkpoint PATH"]), ("evaluate", ["--checkpoint PATH"]), ("visualize", ["--checkpoint PATH"]),
    ("export", ["--checkpoint PATH", "--out PATH"]), ("average-checkpoints", ["--out PATH"]),
    ("train", ["--config NAME"]), ("sweep", ["(--config NAME | --compare SWEEP_DIR"]),
])
def test_usage_shows_required_options_as_required(command, required):
    usage = " ".join(parser_of(command).format_usage().split())
    for option in required:
        assert option in usage and f"[{option}" not in usage, usage


def test_every_script_is_named_after_its_command():
    for path in sorted((ROOT / "scripts").glob("*.py")):
        if path.name == "_entry.py":
            continue
        call = next(n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_command")
        assert call.args[0].value == path.stem.replace("_", "-"), path.name
    assert command_name("average") == "average-checkpoints" and command_name("prepare_data") == "prepare-data"
    assert command_name("averag") is None


def test_the_older_command_name_still_runs(tmp_path, command):
    line = one_error(command, "average", tmp_path / "a.pt", "--out", tmp_path / "avg.pt")
    assert line == f"checkpoint {tmp_path / 'a.pt'} not found"


@pytest.mark.parametrize("name, args, field, expected", [
    ("train", ["--config", "tiny.yaml", "train.max_steps=20", "--out", "x", "model.N=1"], "overrides",
     ["train.max_steps=20", "model.N=1"]),
    ("sweep", ["--config", "tiny.yaml", "--seeds", "1", "train.seed=3", "--parallel", "2", "model.N=1"], "overrides",
     ["train.seed=3", "model.N=1"]),
    ("translate", ["--checkpoint", "x", "Ein Hund.", "--beam", "2", "Zwei Katzen."], "text",
     ["Ein Hund.", "Zwei Katzen."]),
])
def test_words_after_an_option_are_read_as_words_before_it(name, args, field, expected):
    parsed = import_module(f"annotated_transformer.cli.{name}").build_parser(name).parse_args(args)
    assert getattr(parsed, field) == expected


def test_words_after_a_double_dash_stay_words():
    parsed = parser_of("translate").parse_args(["--checkpoint", "x", "--", "--beam", "4", "-Ein"])
    assert parsed.text == ["--beam", "4", "-Ein"] and parsed.beam is None and parsed.checkpoint == "x"


@pytest.mark.parametrize("args, message", [
    (("--compare", "runs/a", "--grid", "grid.yaml"),
     "--grid is for a sweep that trains; --compare trains nothing (it reports the runs in its folders): leave it out"),
    (("--compare", "runs/a", "--seeds", "0"), "--seeds is for a sweep that trains"),
    (("--compare", "runs/a", "--seed-list", "1,2"), "--seed-list is for a sweep that trains"),
    (("--compare", "runs/a", "--parallel", "2"), "--parallel is for a sweep that trains"),
    (("--compare", "runs/a", "--data-root", ""), "--data-root is for a sweep that trains"),
    (("--compare", "runs/a", "--score-test"), "--score-test is for a sweep that trains"),
    (("--compare", "runs/a", "train.epochs=2"), "the override train.epochs=2 is for a sweep that trains"),
    (("--config", "copy", "--target-bleu", "30"),
     "--target-bleu is for --compare; a sweep that trains is timed to its config's train.target_bleu (an override: "
     "train.target_bleu=B)"),
])
def test_a_sweep_refuses_options_that_mean_nothing_for_what_it_does(args, message, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert one_error(command, "sweep", *args).startswith(message)
    assert not any(tmp_path.iterdir())  # nothing written, nothing trained


@pytest.mark.slow  # a second Python process: about 2 s
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`command | head`: the closed pipe ends the command with 141, as SIGPIPE would, and no traceback."""
    import subprocess
    import sys

    script = ("from annotated_transformer.runtime.errors import run_cli\n"
              "run_cli(lambda: [print('line', i) for i in range(300000)] and 0)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(20).startswith(b"line 0\n")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


@pytest.mark.slow  # a second Python process: about 2 s
@pytest.mark.parametrize("code", [130, 143, 0])
def test_a_second_ctrl_c_while_a_stopped_command_exits_prints_nothing(code):
    """One Ctrl-C can reach a command twice, a little apart (the terminal's copy and `uv run`'s): after a stop has
    ended the command, the second must not raise inside an exit hook ("Exception ignored in atexit callback")."""
    import subprocess
    import sys

    script = ("import atexit, os, signal, sys, time\n"
              "from annotated_transformer.runtime.errors import run_cli\n"
              "def hook():\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(0.5)\n"
              "    print('exit hook done', file=sys.stderr)\n"
              "atexit.register(hook)\n"
              f"run_cli(lambda: {code}, whole_process=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    if code == 130:
        assert proc.returncode == code and proc.stderr == "exit hook done\n"
    else:  # a command that Ctrl-C did not stop (SIGTERM, or none): Ctrl-C still interrupts the process at once
        assert "KeyboardInterrupt" in proc.stderr and "exit hook done" not in proc.stderr


@pytest.mark.slow  # a second Python process and a wait of over a second
def test_a_later_ctrl_c_still_interrupts_an_exit_that_hangs():
    """After a stop, only the same keypress's copy is ignored: a Ctrl-C over a second later interrupts an exit hook
    (a hanging one could not be stopped by Ctrl-C)."""
    import subprocess
    import sys

    from annotated_transformer.runtime.errors import SAME_SIGNAL_SECONDS

    script = ("import atexit, os, signal, sys, time\n"
              "from annotated_transformer.runtime.errors import run_cli\n"
              "def hook():\n"
              f"    time.sleep({SAME_SIGNAL_SECONDS + 0.3})\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(0.5)\n"
              "    print('exit hook done', file=sys.stderr)\n"
              "atexit.register(hook)\n"
              "run_cli(lambda: 130, whole_process=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" in proc.stderr and "exit hook done" not in proc.stderr, proc.stderr


def test_a_broken_pipe_that_is_not_the_output_is_not_hidden():
    """A worker's or a child's pipe breaking is a fault: it propagates (stdout, here pytest's, is still open)."""
    from annotated_transformer.runtime.errors import run_cli

    def main():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        run_cli(main)


def test_sigterm_ends_a_command_as_ctrl_c_does_leaving_no_half_file(tmp_path, capsys):
    """`timeout` or `kill` (SIGTERM) while --out is written: one line, exit 143, the old file whole, no temporary
    beside it (SIGTERM killed the process, leaving .out.txt.RANDOM.tmp); a forked child still dies of it."""
    import os
    import signal

    from annotated_transformer.cli.translate import write_output
    from annotated_transformer.runtime.errors import run_cli, terminate_raises

    out = tmp_path / "out.txt"
    out.write_text("yesterday's translations\n")

    def work(f):
        f.write("a first line\n")
        os.kill(os.getpid(), signal.SIGTERM)
        f.write("never written\n")

    def main():
        outside.append(signal.getsignal(signal.SIGTERM))
        write_output(str(out), work)

    outside = []
    with pytest.raises(SystemExit) as ended:
        run_cli(main)
    assert outside == [signal.SIG_DFL]  # away from a write, SIGTERM kills at once, even inside a long C call
    assert ended.value.code == 143 and capsys.readouterr().err == "error: terminated (SIGTERM)\n"
    assert sorted(os.listdir(tmp_path)) == ["out.txt"] and out.read_text() == "yesterday's translations\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # as it was before the command
    from annotated_transformer.runtime.errors import Terminated
    from annotated_transformer.runtime.files import atomic_write

    with pytest.raises(Terminated, match="^terminated by SIGTERM while a file was written"):  # from Python: said
        atomic_write(out, lambda f: os.kill(os.getpid(), signal.SIGTERM))
    assert sorted(os.listdir(tmp_path)) == ["out.txt"] and out.read_text() == "yesterday's translations\n"

    with terminate_raises():
        child = os.fork()
        if child == 0:  # a worker forked by the command: SIGTERM kills it, nothing is raised there
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                os._exit(0)
        status = os.waitpid(child, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_ctrl_c_before_training_goes_on_says_nothing_is_lost(tmp_path, monkeypatch, train_command):
    """A Ctrl-C while the run builds its data or model (before training's own stop, which saves last.pt) was the
    bare "error: interrupted": it says what to do, in one line, exit 130."""
    import os
    import signal
    import time

    from annotated_transformer.harness import tasks

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tasks.TaskFiles, "build", interrupted)
    code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={tmp_path / 'run'}", "train.progress=false")
    assert code == 130 and err == ("error: interrupted before training went on; nothing of the run is lost: run the "
                                   "same command to start it, or to continue it from its last.pt\n"), err
    os.kill(os.getpid(), signal.SIGINT)  # the keypress's second copy (uv run's), a moment later: ignored
    time.sleep(0.05)
    from annotated_transformer.config import load_config
    from annotated_transformer.harness.trainer import Trainer, train_worker

    with pytest.raises(KeyboardInterrupt, match="nothing of the run is lost"):  # from Python: still a Ctrl-C,
        try:                                                                    # which `except Exception` lets through
            train_worker(load_config("copy", [f"train.out_dir={tmp_path / 'api'}"]))
        except Exception:
            pytest.fail("a Ctrl-C was caught as an error")
    monkeypatch.undo()
    monkeypatch.setattr(Trainer, "fit", interrupted)  # once training goes on, a Ctrl-C that reaches Python says no more
    code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={tmp_path / 'run2'}", "train.progress=false")
    assert code == 130 and err.splitlines()[-1] == "error: interrupted", err


@pytest.mark.parametrize("args", [
    ("train", "--config", "copy", "--out", ""),  # it trained into runs/copy, as train.out_dir= (below)
    ("sweep", "--config", "copy", "--grid", ""),
    ("benchmark", "--config", "tiny", "--scale", "--data-dir", ""),
    ("average-checkpoints", "a.safetensors", "--out", ""),  # a traceback
    ("visualize", "--checkpoint", "", "Hallo."),
])
def test_an_empty_path_is_refused_before_any_work(args, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    option = args[args.index("") - 1]
    assert one_error(command, *args).startswith(f"argument {option}: an empty path; give the path of a file or folder")
    assert not any(tmp_path.iterdir())


def test_an_empty_run_directory_key_is_refused(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in ("train.out_dir=", "train.out_dir=''", 'train.out_dir=" "'):
        assert one_error(command, "train", "--config", "copy", given) == (
            "train.out_dir is empty; give the run directory, or leave the key out for runs/copy")
    assert not any(tmp_path.iterdir())
