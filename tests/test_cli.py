"""The command line as a user meets it: `python -m annotated_transformer`, one vocabulary of options across the
commands, the scripts as thin doors to the same code, what a --checkpoint may name, and translate at a
terminal (through a pseudo-terminal), with sentences as arguments, and streaming a pipe."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import select
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

from annotated_transformer.cli import COMMANDS, command_name, main as cli_main
from annotated_transformer.runtime.errors import CheckpointError, ConfigError
from annotated_transformer.deploy.translator import resolve_checkpoint, torch_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SHARED = {"--checkpoint", "--out", "--overwrite", "--quantize", "--limit", "--device", "--beam"}
# Which shared options each command takes (the rest have no use for them). --overwrite: every command that writes
# files the user names (train and sweep write run folders, which have train.overwrite=true).
TAKES = {
    "train": {"--out", "--device"},
    "translate": {"--checkpoint", "--out", "--overwrite", "--quantize", "--device", "--beam"},
    "evaluate": SHARED, "export": {"--checkpoint", "--out", "--overwrite", "--quantize"},
    "visualize": {"--checkpoint", "--out", "--overwrite", "--device", "--beam"},
    "average-checkpoints": {"--out", "--overwrite"}, "sweep": {"--out", "--overwrite"},
    "benchmark": {"--checkpoint", "--out", "--overwrite", "--limit", "--device"}, "prepare-data": set(),
    "make-synthetic-corpus": {"--out", "--overwrite"},
}


def parser_of(command: str):
    return import_module(f"annotated_transformer.cli.{COMMANDS[command_name(command)][0]}").build_parser(command)


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command, (_, what) in COMMANDS.items():
        assert re.search(rf"^  {re.escape(command)} +{re.escape(what)}$", out, re.M), command


def test_an_unknown_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["trian", "--config", "copy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: unknown command 'trian'") and "train, translate" in err[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_spells_the_shared_options_alike(command):
    parser = parser_of(command)
    options = {s for action in parser._actions for s in action.option_strings}
    assert options & SHARED == TAKES[command]
    shown = parser.format_help()
    for old in ("--output", "--quantization", "--sentences", "--model", "--force", "--engine", "--sentence",
                "--warmup", "--data-root", "--sweep"):
        # old spellings parse, but --help teaches one vocabulary
        assert not re.search(rf"{old}(?![\w-])", shown), old


@pytest.mark.parametrize("command, argv, dest, value", [
    ("evaluate", ["--checkpoint", "r", "--output", "h.txt"], "out", "h.txt"),
    ("average", ["a.pt", "--output", "avg.pt"], "out", "avg.pt"),
    ("export", ["--checkpoint", "r", "--out", "o", "--quantization", "int8"], "quantize", "int8"),
    ("benchmark", ["--config", "tiny", "--sentences", "12"], "limit", 12),
    ("translate", ["--model", "exported/x"], "checkpoint", "exported/x"),
    ("benchmark", ["--config", "tiny", "--sweep"], "shape_sweep", True),
    ("export", ["--checkpoint", "r", "--out", "o", "--force"], "overwrite", True),
    ("benchmark", ["--config", "tiny", "--warmup", "3"], "warmup_steps", 3),
    ("evaluate", ["--checkpoint", "r", "--engine", "torch"], "engine", "torch"),
    ("visualize", ["--checkpoint", "r", "--sentence", "Ein Mann."], "sentence", "Ein Mann."),
])
def test_old_spellings_still_work(command, argv, dest, value):
    assert getattr(parser_of(command).parse_args(argv), dest) == value


@pytest.mark.parametrize("argv", [["--out", "runs/a", "train.out_dir=runs/b"],
                                  ["--device", "cpu", "train.device=cuda"]])
def test_a_train_shorthand_beside_an_override_that_says_otherwise_is_refused(argv):
    from annotated_transformer.cli.train import parse

    with pytest.raises(ConfigError, match=f"{argv[0]} {argv[1]} and {argv[2]} say different things"):
        parse(["--config", "copy.yaml", *argv])
    args, cfg = parse(["--config", "copy.yaml", *argv[:2], argv[2].split("=")[0] + "=" + argv[1]])  # the same: fine
    assert str(cfg.train.out_dir if argv[0] == "--out" else cfg.train.device) == argv[1]
    if argv[0] == "--out":  # one folder written two ways is the same folder
        parse(["--config", "copy.yaml", "--out", "runs/a/", "train.out_dir=./runs/a"])


def test_under_torchrun_a_config_error_is_said_once_a_machine(monkeypatch, capsys):
    from annotated_transformer.runtime.errors import run_cli

    def bad_key() -> None:
        raise ConfigError("unknown config key 'train.epoch' (did you mean 'train.epochs'?)")

    line = "error: unknown config key 'train.epoch' (did you mean 'train.epochs'?)\n"
    for local_rank, said in (("1", ""), ("0", line)):
        monkeypatch.setenv("LOCAL_RANK", local_rank)  # every rank of the machine reads the same command line
        with pytest.raises(SystemExit) as done:
            run_cli(bad_key)
        assert done.value.code == 2 and capsys.readouterr().err == said


def test_every_script_is_a_thin_door_to_a_command():
    scripts = sorted(p for p in (ROOT / "scripts").glob("*.py") if p.name != "_entry.py")
    commands = set()
    for path in scripts:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_command"]
        assert len(calls) == 1, path.name
        commands.add(calls[0].args[0].value)
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 20, f"{path.name} should stay thin"
    assert commands == set(COMMANDS)  # every command has its script, and no script runs anything else


def test_a_script_without_the_package_says_how_to_set_up():
    # -S: no site-packages, as in a Python where the project was never installed
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "train.py"), "--config", "copy"],
                          capture_output=True, text=True, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert "lacks 'annotated_transformer'" in err[0] and "uv run python scripts/train.py" in err[0]
    assert "Traceback" not in proc.stderr


def test_ctrl_c_while_a_script_loads_torch_is_one_line(monkeypatch, capsys):
    """The first seconds of every script import torch: a Ctrl-C there printed a traceback through torch's modules."""
    import builtins
    import importlib.util

    spec = importlib.util.spec_from_file_location("_entry", ROOT / "scripts" / "_entry.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "annotated_transformer.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as ended:
        entry.run_command("train")
    assert ended.value.code == 130 and capsys.readouterr().err == "error: interrupted\n"


def test_ctrl_c_that_torchs_start_up_would_swallow_still_stops_the_script(capsys, ctrl_c_during_import):
    """torch's C start-up imports NumPy and goes on without it when that fails: a Ctrl-C there was swallowed and the
    command ran on (a training that would not stop). The script waits for the import's end, then stops."""
    import importlib.util
    import signal
    import types

    spec = importlib.util.spec_from_file_location("_entry", ROOT / "scripts" / "_entry.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    ran, before = [], signal.getsignal(signal.SIGINT)
    ctrl_c_during_import("annotated_transformer.cli", lambda: None,  # swallowed, as torch's C start-up does
                         lambda: types.SimpleNamespace(run=lambda *args, **kwargs: ran.append(args)))
    with pytest.raises(SystemExit) as ended:
        entry.run_command("train")
    assert ended.value.code == 130 and capsys.readouterr().err == "error: interrupted\n" and ran == []
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_python_m_and_the_console_command_run_the_cli():
    by_module = subprocess.run([sys.executable, "-m", "annotated_transformer", "--help"], capture_output=True,
                               text=True, timeout=120)
    assert by_module.returncode == 0 and all(c in by_module.stdout for c in COMMANDS)
    console = Path(sys.executable).parent / "annotated-transformer"
    proc = subprocess.run([str(console), "translate", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: annotated-transformer translate")


# ---------------------------------------------------------------- one list syntax


@pytest.mark.parametrize("command, argv, dest, value", [
    ("visualize", ["--checkpoint", "r", "--layers", "1,3"], "layers", [1, 3]),
    ("visualize", ["--checkpoint", "r", "--formats", "png,html"], "formats", ["png", "html"]),
    ("sweep", ["--compare", "runs/a,runs/b"], "compare", ["runs/a", "runs/b"]),
    ("sweep", ["--config", "copy", "--seed-list", "1,2,3"], "seed_list", [1, 2, 3]),
    ("benchmark", ["--config", "tiny", "--sweep-tokens", "256,512"], "sweep_tokens", [256, 512]),
    ("benchmark", ["--config", "tiny", "--modes", "eager,compiled"], "modes", ["eager", "compiled"]),
    ("benchmark", ["--config", "tiny", "--arms", "token cutoff 0.1,no attention dropout"], "arms",
     ["token cutoff 0.1", "no attention dropout"]),
])
def test_a_list_is_one_word_with_commas_and_the_older_spaces_still_parse(command, argv, dest, value):
    parser = parser_of(command)
    assert getattr(parser.parse_args(argv), dest) == value
    spaced = [*argv[:-1], *argv[-1].split(",")]  # the older spelling: one word an item
    assert getattr(parser.parse_args(spaced), dest) == value
    shown = next(a.metavar for a in parser._actions if a.dest == dest)
    assert shown.endswith(",...") and f" {shown}" in " ".join(parser.format_usage().split())  # --help: commas only


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_list_option_takes_one_comma_separated_word(command):
    for action in parser_of(command)._actions:
        if action.option_strings and action.nargs not in (None, 0):  # a list of words: only arguments take one
            pytest.fail(f"{command} {action.option_strings[0]} takes {action.nargs!r} words; use add_list")


def test_a_spaced_list_stops_at_the_sentence_and_the_overrides_after_it():
    args = parser_of("visualize").parse_args(["--checkpoint", "r", "--layers", "1", "3", "Ein", "Mann"])
    assert (args.layers, args.text) == ([1, 3], ["Ein", "Mann"])
    args = parser_of("visualize").parse_args(["--checkpoint", "r", "--formats", "png", "html", "Ein", "Mann"])
    assert (args.formats, args.text) == (["png", "html"], ["Ein", "Mann"])
    args = parser_of("sweep").parse_args(["--config", "copy", "--seed-list", "1", "2", "train.epochs=2"])
    assert (args.seed_list, args.overrides) == ([1, 2], ["train.epochs=2"])
    args = parser_of("sweep").parse_args(["--compare", "runs/a", "runs/b", "--out", "o", "data.root=/d"])
    assert (args.compare, args.out, args.overrides) == (["runs/a", "runs/b"], "o", ["data.root=/d"])


# ---------------------------------------------------------------- docs/commands.md and --help agree

COMMANDS_MD = ROOT / "docs" / "commands.md"


def cells(row: str) -> list[str]:
    """A markdown table row's cells (an escaped \\| stays inside its cell), without backticks."""
    return [c.strip().replace("`", "").replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]]


def documented_options() -> dict[str, dict[str, str]]:
    """commands.md's table of each command (under ### `NAME`): option -> its "required" cell."""
    tables = {}
    for name, section in re.findall(r"^### `([\w-]+)`\n(.*?)(?=^#|\Z)", COMMANDS_MD.read_text(encoding="utf-8"),
                                    flags=re.M | re.S):
        rows = [cells(line) for line in section.splitlines() if line.startswith("| `")]
        tables[name] = {row[0].split()[0]: row[1] for row in rows if row[0].startswith("--")}
    return tables


@pytest.mark.parametrize("command", list(COMMANDS))
def test_commands_md_lists_every_option_of_help_and_what_it_requires(command):
    parser = parser_of(command)
    documented = documented_options()[command]
    assert sorted(documented) == sorted(parser.option_names())  # nothing missing, nothing extra (older ones hidden)
    in_group = {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for action in parser._actions:
        if action.option_strings and action.option_strings[0] in documented:
            said = documented[action.option_strings[0]]
            if action.required:
                assert said == "yes", action.option_strings
            elif action in in_group:
                assert said.startswith("this or "), action.option_strings
            else:
                assert said == "" or said.startswith("with "), action.option_strings  # with: needed beside another


def test_commands_md_names_the_commands_that_take_each_shared_option():
    text = COMMANDS_MD.read_text(encoding="utf-8")
    shared = text.partition("## Options every command spells the same way")[2].partition("\n\n")[2]
    rows = [cells(line) for line in shared.split("\n\n")[0].splitlines() if line.startswith("| `--")]
    assert len(rows) >= 8
    for option, _, commands in rows:
        name = option.split()[0]
        takes = {c for c in COMMANDS if name in parser_of(c).option_names()}
        assert {c.strip() for c in commands.split(",")} == takes, name


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_names_a_pt_file_only_as_an_older_ones(command):
    shown = " ".join(parser_of(command).format_help().split())
    for found in re.finditer(r"\.pt\b", shown):
        assert "older" in shown[max(0, found.start() - 12):found.start()], shown[found.start() - 60:found.end()]


# ---------------------------------------------------------------- what --checkpoint names


def make_run(folder: Path, files: list[str], final: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).write_bytes(b"weights")
    records = [{"kind": "epoch", "epoch": 1}]
    if final:
        records.append({"kind": "final", "checkpoint": final, "checkpoint_file": final})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.mark.parametrize("files, final, chosen", [
    (["best.safetensors", "avg.safetensors", "last.pt"], "avg.safetensors", "avg.safetensors"),  # the average won
    (["best.safetensors", "avg.safetensors", "last.pt"], "best.safetensors", "best.safetensors"),
    (["best.safetensors", "last.pt"], None, "best.safetensors"),  # still training, or stopped: the best so far
    (["last.pt"], None, "last.pt"),
    (["best.safetensors"], "avg.safetensors", "best.safetensors"),  # the file the record names was removed
    (["best.pt", "avg.pt", "last.pt"], "avg.pt", "avg.pt"),  # a run of an older version: .pt files
    (["best.pt", "last.pt"], None, "best.pt"),
])
def test_a_run_directory_stands_for_the_weights_its_scores_used(tmp_path, files, final, chosen):
    run = make_run(tmp_path / "run", files, final)
    assert resolve_checkpoint(run) == ("torch", run / chosen)


def test_an_exported_folder_means_ctranslate2_and_a_file_means_torch(tmp_path):
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"")
    assert resolve_checkpoint(folder) == ("ctranslate2", folder)
    assert resolve_checkpoint(folder / "model.bin") == ("ctranslate2", folder)
    assert resolve_checkpoint(tmp_path / "some.pt") == ("torch", tmp_path / "some.pt")  # missing: the loader says so
    with pytest.raises(ConfigError, match="is an exported model folder; export needs the run directory or model file"):
        torch_checkpoint(folder, "export")  # export, visualize and the benchmark need the PyTorch model


def test_a_folder_that_is_neither_is_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="neither a run directory .* nor a model folder"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="holds no checkpoint yet"):
        resolve_checkpoint(make_run(tmp_path / "empty_run", []))


# ---------------------------------------------------------------- translate, on a trained model


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    from annotated_transformer import Translator

    return Translator.from_checkpoint(tiny_checkpoint, device="cpu")


def translate_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "translate.py"), "--device", "cpu", *args]


def read_until(fd: int, needle: bytes, seen: bytes = b"", timeout: float = 120.0) -> bytes:
    """Bytes from `fd` until `needle` appears (the timeout only keeps a broken program from hanging the suite)."""
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no {needle!r} within {timeout} s; got {seen[-300:]!r}"
        chunk = os.read(fd, 4096)
        assert chunk, f"the program closed before {needle!r}; got {seen[-300:]!r}"
        seen += chunk
    return seen


def translate_in_process(capsysbinary, monkeypatch, *args: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    """`python -m annotated_transformer translate ARGS` in this process: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    with pytest.raises(SystemExit) as done:
        cli_main(["translate", "--device", "cpu", *args])
    out, err = capsysbinary.readouterr()
    return done.value.code, out, err


def test_sentences_given_as_arguments(tiny_checkpoint, translator, capsysbinary, monkeypatch):
    run_dir = str(tiny_checkpoint.parent)  # a run directory stands for its weights
    code, out, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", run_dir, "Ein", "Mann", "fährt",
                                          "Fahrrad.")
    assert code == 0 and out.decode().splitlines() == translator.translate(["Ein Mann fährt Fahrrad."]), err
    code, out, _ = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", run_dir, "--sentence", "Eine Frau.",
                                        "--sentence", "Kinder spielen.")
    assert code == 0 and out.decode().splitlines() == translator.translate(["Eine Frau.", "Kinder spielen."])
    code, _, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", run_dir, "--input", "de.txt", "Ein")
    assert code == 2 and b"not both" in err


def test_each_quoted_argument_is_one_sentence_and_one_line(tiny_checkpoint, translator, capsysbinary, monkeypatch):
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Kinder spielen."]
    code, out, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", str(tiny_checkpoint), *sentences)
    lines = out.decode().splitlines()
    assert code == 0 and len(lines) == 2 and lines == translator.translate(sentences), err


def test_words_without_quotes_next_to_each_other_are_one_sentence():
    from annotated_transformer.cli.translate import build_parser, sentences_of

    assert sentences_of(["Ein", "Mann", "fährt."]) == ["Ein Mann fährt."]
    assert sentences_of(["Ein Mann fährt.", "Hund", "und", "Katze", "Eine Frau."]) == [
        "Ein Mann fährt.", "Hund und Katze", "Eine Frau."]
    assert sentences_of([]) == []
    # the shell drops the quotes of one-word sentences: a word that ends a sentence ends the run of words
    assert sentences_of(["Hallo.", "Danke!"]) == ["Hallo.", "Danke!"]
    assert sentences_of(["Ein", "Hund.", "Eine", "Katze"]) == ["Ein Hund.", "Eine Katze"]
    text = next(a for a in build_parser("translate")._actions if a.dest == "text")
    assert "quote each one" in text.help and "words without quotes" in text.help


def test_a_file_in_a_file_out_and_a_bad_line_later(tiny_checkpoint, translator, tmp_path, capsysbinary, monkeypatch):
    src, out = tmp_path / "de.txt", tmp_path / "en.txt"
    src.write_text("Ein Mann.\n\nEine Frau.\n", encoding="utf-8")
    code, stdout, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", str(tiny_checkpoint), "--input",
                                             str(src), "--out", str(out))
    assert code == 0 and stdout == b"", err
    assert out.read_text(encoding="utf-8").split("\n") == [*translator.translate(["Ein Mann.", "", "Eine Frau."]), ""]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["de.txt", "en.txt"]  # no partial file left
    code, stdout, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", str(tiny_checkpoint),
                                             stdin=b"Ein Mann.\nStra\xdfe\n")
    lines = err.decode().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "not UTF-8 text: line 2 has the byte" in lines[0]
    assert stdout.decode().splitlines() in ([], translator.translate(["Ein Mann."]))  # never past the bad line



def test_translating_into_the_same_file_again_needs_overwrite(tiny_checkpoint, translator, tmp_path, capsysbinary,
                                                              monkeypatch):
    src, out = tmp_path / "de.txt", tmp_path / "en.txt"
    src.write_text("Ein Mann.\n", encoding="utf-8")
    args = ("--checkpoint", str(tiny_checkpoint), "--input", str(src), "--out", str(out))
    code, _, err = translate_in_process(capsysbinary, monkeypatch, *args)
    assert code == 0, err
    first = out.read_text(encoding="utf-8")
    src.write_text("Eine Frau.\nKinder spielen.\n", encoding="utf-8")
    code, stdout, err = translate_in_process(capsysbinary, monkeypatch, *args)  # the same command again
    assert code == 2 and stdout == b""
    assert err.decode().splitlines() == [f"error: {out} already exists (a file); choose another --out, or pass "
                                         "--overwrite to replace it"]
    assert out.read_text(encoding="utf-8") == first
    code, _, err = translate_in_process(capsysbinary, monkeypatch, *args, "--overwrite")
    assert code == 0, err
    assert out.read_text(encoding="utf-8").splitlines() == translator.translate(["Eine Frau.", "Kinder spielen."])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["de.txt", "en.txt"]  # no temporary left


@pytest.mark.parametrize("spelling", ["same", "another"])
def test_translate_never_writes_over_its_input(tiny_checkpoint, tmp_path, capsysbinary, monkeypatch, spelling):
    src = tmp_path / "de.txt"
    src.write_text("Ein Mann.\n", encoding="utf-8")
    out = src if spelling == "same" else tmp_path / "sub" / ".." / "de.txt"
    (tmp_path / "sub").mkdir()
    for extra in ((), ("--overwrite",)):
        code, stdout, err = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", str(tiny_checkpoint),
                                                 "--input", str(src), "--out", str(out), *extra)
        assert code == 2 and stdout == b""
        assert err.decode().splitlines() == [f"error: --out {out} is the --input file, which the command reads: it "
                                             "is never replaced, not even with --overwrite; choose another --out"]
    assert src.read_text(encoding="utf-8") == "Ein Mann.\n"


def test_a_translate_killed_while_writing_leaves_the_old_output_whole(tiny_checkpoint, tmp_path, capsysbinary,
                                                                     monkeypatch):
    from annotated_transformer.cli import translate

    src, out = tmp_path / "de.txt", tmp_path / "en.txt"
    src.write_text("Ein Mann.\n", encoding="utf-8")
    out.write_text("the earlier translation\n", encoding="utf-8")

    def half_then_killed(translator, decode, lines, first, stream):
        stream.write("half a transl")
        stream.flush()
        raise KeyboardInterrupt  # Ctrl-C in the middle of writing

    monkeypatch.setattr(translate, "write_translations", half_then_killed)
    code, _, _ = translate_in_process(capsysbinary, monkeypatch, "--checkpoint", str(tiny_checkpoint), "--input",
                                      str(src), "--out", str(out), "--overwrite")
    assert code == 130
    assert out.read_text(encoding="utf-8") == "the earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["de.txt", "en.txt"]


@pytest.mark.slow
def test_a_pipe_gets_each_answer_before_its_next_line(tiny_checkpoint, translator):
    lines = ["Ein Mann fährt Fahrrad.", "", "Kinder spielen."]
    proc = subprocess.Popen(translate_command("--checkpoint", str(tiny_checkpoint)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        answers = []
        for line in lines:  # the next line is written only after the answer to this one came back
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            answers.append(read_until(proc.stdout.fileno(), b"\n").decode().rstrip("\n"))
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()
    assert answers == translator.translate(lines) and answers[1] == ""


@pytest.mark.slow
def test_interactive_at_a_terminal(tiny_checkpoint, translator):
    master, slave = os.openpty()
    proc = subprocess.Popen(translate_command("--checkpoint", str(tiny_checkpoint)), stdin=slave, stdout=slave,
                            stderr=slave, env={**os.environ, "TERM": "dumb"}, close_fds=True)
    os.close(slave)
    try:
        seen = read_until(master, b"de> ")  # the model loads first, then the prompt
        assert b"Type a German sentence" in seen and str(tiny_checkpoint).encode() in seen
        for sentence in ("Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."):
            os.write(master, sentence.encode() + b"\n")
            answer = read_until(master, b"de> ").decode()
            shown = [line.strip() for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", answer).splitlines()]
            assert translator.translate([sentence])[0] in shown
        os.write(master, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(master)


# A fresh interpreter translates one sentence with the translate command and with Translator.load, then prints the
# command's exit code, the API's answer and the chart libraries loaded on the way, as one JSON line.
TRANSLATE_THEN_LIST_CHARTS = """if True:
    import json, sys
    from annotated_transformer import Translator
    from annotated_transformer.cli import main
    checkpoint, sentence = sys.argv[1:]
    try:
        main(["translate", "--device", "cpu", "--checkpoint", checkpoint, sentence])
    except SystemExit as exc:
        code = exc.code
    answer = Translator.load(checkpoint, device="cpu").translate(sentence)
    charts = sorted({name.split(".")[0] for name in sys.modules} & {"altair", "vl_convert"})
    print(json.dumps({"code": code, "answer": answer, "charts": charts}))
"""


@pytest.mark.slow
def test_translating_loads_no_chart_library(tiny_checkpoint, translator):
    """altair and vl-convert take seconds to import and are only for charts: a translation, by the command or by
    Translator.load, never imports them (a process of its own, since this one has charts loaded by other tests)."""
    sentence = "Ein Mann fährt Fahrrad."
    proc = subprocess.run([sys.executable, "-c", TRANSLATE_THEN_LIST_CHARTS, str(tiny_checkpoint.parent), sentence],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    *printed, told = proc.stdout.splitlines()
    found = json.loads(told)
    expected = translator.translate([sentence])
    assert found["code"] == 0 and printed == expected and [found["answer"]] == expected, proc.stderr
    assert found["charts"] == []
