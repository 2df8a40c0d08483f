"""evaluate --input SRC --ref REF: any pair of files scored as a split is, its hypotheses never overwritten unasked,
and the mistakes around it (unpaired files, a missing half, --limit below 1) one line each."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest


def val_lines(multi30k_dir: Path, lang: str, n: int) -> list[str]:
    """The first `n` lines of Multi30k's val split in `lang`, as the files hold them."""
    with gzip.open(multi30k_dir / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:n]


def write_pair(folder: Path, name: str, multi30k_dir: Path, n: int) -> tuple[Path, Path]:
    """NAME.de and NAME.en in `folder`: the first `n` val sentences and their references, one a line."""
    src, ref = folder / f"{name}.de", folder / f"{name}.en"
    src.write_text("\n".join(val_lines(multi30k_dir, "de", n)) + "\n", encoding="utf-8")
    ref.write_text("\n".join(val_lines(multi30k_dir, "en", n)) + "\n", encoding="utf-8")
    return src, ref


def one_error(command, *args: object) -> str:
    """Run evaluate where it must fail: exit 2, nothing on stdout, one `error: ...` line on stderr; that line."""
    code, stdout, stderr = command("evaluate", *args)
    lines = stderr.decode().splitlines()
    assert code == 2 and stdout == b"" and len(lines) == 1 and lines[0].startswith("error: "), (code, stderr)
    return lines[0].removeprefix("error: ")


def test_a_pair_of_files_scores_as_the_same_sentences_of_a_split(tiny_checkpoint, multi30k_dir, tmp_path, command):
    src, ref = write_pair(tmp_path, "mine", multi30k_dir, 12)
    common = ("--checkpoint", tiny_checkpoint, "--device", "cpu", "--json")
    code, out, err = command("evaluate", *common, "--input", src, "--ref", ref, "--out", tmp_path / "files.txt")
    assert code == 0, err.decode()
    files = json.loads(out)
    code, out, err = command("evaluate", *common, "--split", "val", "--limit", "12", "--out", tmp_path / "split.txt",
                             "data.root=" + str(multi30k_dir))
    assert code == 0, err.decode()
    split = json.loads(out)
    assert (files["input"], files["ref"], files["sentences"]) == (str(src), str(ref), 12) and "split" not in files
    assert (tmp_path / "files.txt").read_text() == (tmp_path / "split.txt").read_text()
    assert len((tmp_path / "files.txt").read_text().splitlines()) == 12
    assert files["signature"] == split["signature"]  # the same sacreBLEU settings ...
    for key in ("bleu", "bleu_lc", "chrf"):  # ... and the same figures
        assert files["scores"][key]["score"] == pytest.approx(split["scores"][key]["score"], abs=1e-9), key


def test_scoring_a_split_reads_only_that_splits_files(tiny_checkpoint, multi30k_dir, tmp_path, command):
    """The vocabulary is in the model file: a folder with only val's two Multi30k files scores val; own files
    whose training split is gone score their val split; a missing split names --input/--ref."""
    import shutil

    from annotated_transformer.config import load_config
    from annotated_transformer.data.translation_data import read_one_split

    val_only = tmp_path / "val_only"
    val_only.mkdir()
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copy(multi30k_dir / name, val_only / name)
    code, out, err = command("evaluate", "--checkpoint", tiny_checkpoint, "--split", "val", "--limit", "3", "--json",
                             "--out", tmp_path / "val.txt", f"data.root={val_only}")
    assert code == 0 and json.loads(out)["sentences"] == 3, err.decode()
    code, _, err = command("evaluate", "--checkpoint", tiny_checkpoint, "--split", "test", "--limit", "3",
                           "--out", tmp_path / "test.txt", f"data.root={val_only}")
    assert code == 2 and "test_2016_flickr.de.gz is missing" in err.decode()
    corpus = tmp_path / "corpus"  # your own files, the training split deleted since
    corpus.mkdir()
    (corpus / "val.xx").write_text("a b\nc d\n")
    (corpus / "val.yy").write_text("b a\nd c\n")
    cfg = load_config("tiny", ["data.dataset=files", "data.src_lang=xx", "data.tgt_lang=yy",
                               f"data.train={corpus / 'train'}", f"data.val={corpus / 'val'}"]).data
    assert read_one_split(cfg, "val") == (["a b", "c d"], ["b a", "d c"])


def test_hypotheses_go_to_eval_in_the_run_and_are_never_overwritten_unasked(tiny_checkpoint, multi30k_dir, tmp_path,
                                                                          command):
    name = f"pair_{tmp_path.name}"  # a name of its own in the session's run directory
    src, ref = write_pair(tmp_path, name, multi30k_dir, 4)
    args = ("--checkpoint", tiny_checkpoint.parent, "--device", "cpu", "--input", src, "--ref", ref, "--beam", "1")
    code, out, err = command("evaluate", *args)
    assert code == 0, err.decode()
    hyps = tiny_checkpoint.parent / "eval" / f"{name}.de.beam1.txt"
    first = out.decode().splitlines()[0]
    assert first.startswith(f"{name}.de: 4 sentences, beam 1") and first.endswith(f"hypotheses in {hyps}")
    translations = hyps.read_text(encoding="utf-8")
    assert len(translations.splitlines()) == 4

    hyps.write_text("kept\n", encoding="utf-8")
    message = one_error(command, *args)
    assert message == f"{hyps} already exists (a file); choose another --out, or pass --overwrite to replace it"
    assert hyps.read_text(encoding="utf-8") == "kept\n"
    code, _, err = command("evaluate", *args, "--overwrite")
    assert code == 0, err.decode()
    assert hyps.read_text(encoding="utf-8") == translations


def test_a_limited_evaluate_writes_a_name_of_its_own_that_the_run_knows(tiny_checkpoint, multi30k_dir, tmp_path,
                                                                       command):
    from annotated_transformer.harness.run_dir import INSIDE

    name = f"cut_{tmp_path.name}"
    src, ref = write_pair(tmp_path, name, multi30k_dir, 4)
    args = ("--checkpoint", tiny_checkpoint.parent, "--device", "cpu", "--input", src, "--ref", ref, "--beam", "1")
    code, _, err = command("evaluate", *args, "--limit", "2")
    assert code == 0, err.decode()
    cut, whole = (tiny_checkpoint.parent / "eval" / f"{name}.de{part}.beam1.txt" for part in (".first2", ""))
    assert len(cut.read_text(encoding="utf-8").splitlines()) == 2 and not whole.exists()
    assert INSIDE["eval"].match(cut.name)  # train.overwrite counts it among the run's files
    code, _, err = command("evaluate", *args, "--limit", "4")  # a limit of every sentence is the whole file
    assert code == 0 and len(whole.read_text(encoding="utf-8").splitlines()) == 4, err.decode()


def test_batch_size_sets_how_many_sentences_evaluate_decodes_together(tiny_checkpoint, multi30k_dir, tmp_path,
                                                                       command, monkeypatch):
    import inspect

    from annotated_transformer.checkpoints import load_checkpoint
    from annotated_transformer.deploy.translator import Translator

    seen = []
    decode = Translator.translate_ids

    def spy(*args, **kwargs):
        seen.append(inspect.signature(decode).bind(*args, **kwargs).arguments["batch_size"])
        return decode(*args, **kwargs)

    monkeypatch.setattr(Translator, "translate_ids", spy)
    src, ref = write_pair(tmp_path, "mine", multi30k_dir, 3)
    code, _, err = command("evaluate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--input", src, "--ref", ref,
                           "--beam", "1", "--batch-size", "2", "--out", tmp_path / "h.txt")
    assert code == 0, err.decode()
    assert load_checkpoint(tiny_checkpoint)["config"]["decode"]["batch_size"] != 2  # so 2 is --batch-size's
    assert seen == [2] and len((tmp_path / "h.txt").read_text(encoding="utf-8").splitlines()) == 3
    assert one_error(command, "--checkpoint", "nowhere", "--batch-size", "0") == \
        "--batch-size must be at least 1, got 0"


def test_an_existing_out_file_is_refused_for_a_split_too(tiny_checkpoint, tmp_path, command):
    out = tmp_path / "h.txt"
    out.write_text("kept\n", encoding="utf-8")
    message = one_error(command, "--checkpoint", tiny_checkpoint, "--device", "cpu", "--split", "val", "--limit", "3",
                        "--out", out)
    assert message == f"{out} already exists (a file); choose another --out, or pass --overwrite to replace it"
    assert out.read_text(encoding="utf-8") == "kept\n"


@pytest.mark.parametrize("option", ["--input", "--ref"])
def test_out_is_never_a_file_evaluate_reads(tmp_path, command, option):
    src, ref = tmp_path / "a.de", tmp_path / "a.en"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    ref.write_text("A dog.\n", encoding="utf-8")
    out = src if option == "--input" else ref
    for extra in ((), ("--overwrite",)):
        message = one_error(command, "--checkpoint", "nowhere", "--input", src, "--ref", ref, "--out", out, *extra)
        assert message == (f"--out {out} is the {option} file, which the command reads: it is never replaced, not "
                           "even with --overwrite; choose another --out")  # before any model is loaded
    assert (src.read_text(encoding="utf-8"), ref.read_text(encoding="utf-8")) == ("Ein Hund.\n", "A dog.\n")


@pytest.mark.parametrize("name", ["best.safetensors", "last.pt", "metrics.jsonl", "vocab/text_pipeline.json"])
def test_out_is_never_a_file_the_run_keeps(tiny_checkpoint, tmp_path, command, name):
    """A run directory given as --checkpoint: its weights, state, records and vocabulary are never an --out, even
    with --overwrite (the hypotheses' own names are)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run)
    before = (run / name).read_bytes()
    for cmd, args in (("evaluate", ("--split", "val", "--limit", "3")), ("translate", ("Ein Hund.",))):
        code, _, stderr = command(cmd, "--checkpoint", run, *args, "--out", run / name, "--overwrite")
        assert code == 2 and stderr.decode() == (
            f"error: --out {run / name} is a file of the run or export in {run} (its weights, state, records, "
            "charts or vocabulary), which the commands read: it is never replaced, not even with --overwrite; "
            "choose another --out\n")
    other = tmp_path / "other_run"  # a run that no --checkpoint names keeps its files too
    shutil.copytree(tiny_checkpoint.parent, other)
    code, _, stderr = command("translate", "--checkpoint", run, "Ein Hund.", "--out", other / name, "--overwrite")
    assert code == 2 and f"is a file of the run or export in {other} " in stderr.decode()
    if name.endswith(".safetensors") or name.endswith(".pt"):  # an average over a run's own model file
        code, _, stderr = command("average-checkpoints", run / "best.safetensors", "--out", other / name,
                                  "--overwrite")
        assert code == 2 and f"is a file of the run or export in {other} " in stderr.decode(), stderr.decode()
    assert (run / name).read_bytes() == before and (other / name).read_bytes() == before
    code, _, stderr = command("average-checkpoints", run / "best.safetensors", "--out", other / "avg.safetensors",
                              "--overwrite")  # a run's avg file is an average of its own checkpoints, not another's
    assert code == 2 and "which only that run's own checkpoints make" in stderr.decode(), stderr.decode()
    code, _, stderr = command("average-checkpoints", other / "best.safetensors", "--out", other / "avg.safetensors",
                              "--overwrite")
    assert code == 0 and (other / "avg.safetensors").is_file(), stderr.decode()
    code, _, stderr = command("evaluate", "--checkpoint", run / "best.safetensors", "--split", "val", "--limit", "3",
                              "--out", run / "last.pt", "--overwrite")  # a model file of the run: its folder too
    assert code == 2 and "is a file of the run or export in" in stderr.decode()
    code, _, stderr = command("translate", "--checkpoint", run, "Ein Hund.", "--out", run / "vocab", "--overwrite")
    assert code == 2 and f"--out {run / 'vocab'} is a folder of the run or export in {run} " in stderr.decode()
    mine = tmp_path / "mine"  # your own folder, a model file and a config.yaml of yours in it: not a run's
    (mine / "charts").mkdir(parents=True)
    shutil.copy(run / "best.safetensors", mine / "m.safetensors")
    (mine / "config.yaml").write_text("notes: mine\n")
    code, _, stderr = command("translate", "--checkpoint", mine / "m.safetensors", "Ein Hund.", "--out",
                              mine / "charts" / "a.txt")
    assert code == 0, stderr.decode()


def test_files_that_do_not_pair_up_are_one_line_and_write_nothing(tiny_checkpoint, tmp_path, command):
    src, ref = tmp_path / "a.de", tmp_path / "a.en"
    src.write_text("Ein Hund.\nZwei Katzen.\nEin Mann.\n", encoding="utf-8")
    ref.write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    message = one_error(command, "--checkpoint", tiny_checkpoint, "--input", src, "--ref", ref,
                        "--out", tmp_path / "h.txt")
    assert message == (f"--input {src} has 3 lines but --ref {ref} has 2: line i of the reference must translate "
                       "line i of the input; fix the files so they pair up")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.de", "a.en"]


@pytest.mark.parametrize("args, message", [
    (["--input", "a.de"], "--input needs --ref: evaluate scores a source file (--input) against its reference "
                          "translations (--ref)"),
    (["--ref", "a.en"], "--ref needs --input: evaluate scores a source file (--input) against its reference "
                        "translations (--ref)"),
    (["--input", "a.de", "--ref", "a.en", "--split", "val"],
     "--split chooses a split of the model's data; --input and --ref score your own files instead: give one or the "
     "other"),
    (["--input", "a.de", "--ref", "a.en", "data.root=/data"],
     "data.root chooses a split of the model's data; --input and --ref score your own files instead: give one or the "
     "other"),
    (["--limit", "0"], "--limit must be at least 1, got 0; leave it out to score every sentence"),
    (["--limit", "-3"], "--limit must be at least 1, got -3; leave it out to score every sentence"),
])
def test_mistakes_around_the_files_and_limit_are_one_line(args, message, command):
    assert one_error(command, "--checkpoint", "nowhere", *args) == message  # before any model is loaded
