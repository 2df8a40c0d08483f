"""The synthetic corpus of WMT length (make-synthetic-corpus) and the scale benchmark (benchmark --scale): the corpus's
lines, languages, sizes and seed, written in chunks; the measuring of a command (its processes' memory, its marks,
its time limit); the goals judged from what was measured; the benchmark end to end on 2,000 pairs. No figure of
speed or memory is asserted against a goal here: the goals belong to the benchmark, run on a quiet machine."""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from annotated_transformer.lab import scale_benchmark, synthetic_corpus
from annotated_transformer.lab.scale_benchmark import GOALS, judge, run_measured, training_marks
from annotated_transformer.lab.synthetic_corpus import CorpusSpec, has_corpus, write_corpus
from annotated_transformer.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def fake_multi30k(words: int = 1):
    """A stand-in for Multi30k's splits: 'SPLIT-de-I' / 'SPLIT-en-I' (each `words` times, spaced), 97 pairs a split,
    so every line of a corpus names the pairs it joined."""
    def lines(split: str) -> tuple[list[str], list[str]]:
        return tuple([" ".join([f"{split}-{lang}-{i}"] * words) for i in range(97)] for lang in ("de", "en"))

    return lines


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def test_each_line_is_two_pairs_joined_german_with_german_english_with_english(tmp_path):
    manifest = write_corpus(tmp_path / "c", CorpusSpec(2000, 50, 40, seed=3), fake_multi30k())
    assert manifest == json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert manifest["pairs"] == 2000 and manifest["seed"] == 3
    for split, lines in (("train", 2000), ("val", 50), ("test", 40)):
        de, en = read(tmp_path / "c" / f"{split}.de"), read(tmp_path / "c" / f"{split}.en")
        assert len(de) == len(en) == lines
        for de_line, en_line in zip(de, en):
            first, second = de_line.split(" ")
            assert en_line == f"{first.replace('-de-', '-en-')} {second.replace('-de-', '-en-')}"  # the same two pairs
            assert first.startswith(f"{split}-de-") and second.startswith(f"{split}-de-")  # from its own split
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "corpus.json", "test.de", "test.en", "train.de", "train.en", "val.de", "val.en"]  # no temporary file left


def test_a_seed_makes_the_same_bytes_and_each_split_its_own_lines(tmp_path):
    def make(name: str, spec: CorpusSpec) -> dict[str, bytes]:
        write_corpus(tmp_path / name, spec, fake_multi30k())
        return {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()}

    a, again = make("a", CorpusSpec(500, 30, 30, seed=1)), make("again", CorpusSpec(500, 30, 30, seed=1))
    assert a == again
    other = make("other", CorpusSpec(500, 30, 30, seed=2))
    assert all(other[f"{s}.de"] != a[f"{s}.de"] for s in ("train", "val", "test"))
    bigger = make("bigger", CorpusSpec(800, 30, 30, seed=1))  # a split's lines do not depend on another's size
    assert bigger["val.de"] == a["val.de"] and bigger["test.en"] == a["test.en"]


def test_the_corpus_is_written_in_chunks_never_held_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic_corpus, "CHUNK", 500)
    tracemalloc.start()
    try:
        write_corpus(tmp_path / "c", CorpusSpec(40_000, 10, 10), fake_multi30k(words=6))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    written = sum(p.stat().st_size for p in (tmp_path / "c").glob("train.*"))
    assert written > 8_000_000 and peak < written / 10, (peak, written)


def test_a_corpus_is_replaced_only_with_overwrite_and_found_only_whole(tmp_path):
    own = tmp_path / "own"  # a folder holding only a corpus.json of someone else's: refused, kept as it is
    own.mkdir()
    (own / "corpus.json").write_text("mine")
    with pytest.raises(UserError, match="corpus.json already exists"):
        write_corpus(own, CorpusSpec(100, 10, 10), fake_multi30k())
    assert [p.name for p in own.iterdir()] == ["corpus.json"] and (own / "corpus.json").read_text() == "mine"
    folder, spec = tmp_path / "c", CorpusSpec(100, 10, 10)
    assert has_corpus(folder, spec) is False  # nothing there: make it
    write_corpus(folder, spec, fake_multi30k())
    assert has_corpus(folder, spec) is True
    before = (folder / "train.de").read_bytes()
    with pytest.raises(UserError, match=rf"^{folder / 'train.de'} already exists \(a file\); choose another --out, "
                                        "or pass --overwrite to replace it$"):
        write_corpus(folder, CorpusSpec(100, 10, 10, seed=9), fake_multi30k())
    assert (folder / "train.de").read_bytes() == before
    write_corpus(folder, CorpusSpec(100, 10, 10, seed=9), fake_multi30k(), overwrite=True)
    assert (folder / "train.de").read_bytes() != before
    with pytest.raises(UserError, match=r"holds another synthetic corpus .*'seed': 9.*give another --data-dir"):
        has_corpus(folder, spec)
    (folder / "corpus.json").unlink()  # a make stopped before its manifest, or someone's own files
    with pytest.raises(UserError, match=r"holds train\.de but no corpus\.json: not a whole synthetic corpus"):
        has_corpus(folder, spec)
    assert (folder / "train.de").is_file()  # nothing removed


def test_a_full_disk_while_writing_the_corpus_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """The disk fills during the training split: one line naming the file; the earlier corpus's files stay whole,
    no temporary is left, and no manifest says the half-made corpus is whole."""
    import errno

    folder, spec = tmp_path / "c", CorpusSpec(100, 10, 10)
    write_corpus(folder, spec, fake_multi30k())
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    chunks = synthetic_corpus.joined_chunks

    def filling(*args):
        yield next(chunks(*args))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(synthetic_corpus, "joined_chunks", filling)
    with pytest.raises(UserError, match=rf"^cannot write the train split into {folder}: No space left on device; "):
        write_corpus(folder, CorpusSpec(100, 10, 10, seed=9), fake_multi30k(), overwrite=True)
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert set(after) == set(before) - {"corpus.json"}  # no temporary; the manifest gone: not taken for whole
    assert all(after[name] == before[name] for name in after)


def test_a_corpus_is_never_written_into_a_run(tmp_path):
    from annotated_transformer.harness.run_dir import MARKER  # the name the corpus check spells out

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("{}")
    with pytest.raises(UserError, match=r"--out .*run is a training run's \(or an export's\) folder"):
        write_corpus(run, CorpusSpec(100, 10, 10), fake_multi30k())
    assert sorted(p.name for p in run.iterdir()) == [MARKER]


def test_bad_sizes_are_one_line_before_anything_is_written(tmp_path, command):
    code, stdout, stderr = command("make-synthetic-corpus", "--out", tmp_path / "c", "--val-pairs", "0")
    assert code == 2 and stderr.decode().splitlines() == ["error: --val-pairs must be at least 1, got 0"]
    assert not (tmp_path / "c").exists()


def test_the_command_writes_multi30k_german_and_english(multi30k_dir, tmp_path, command):
    from annotated_transformer.data.multi30k import read_split

    out = tmp_path / "c"
    args = ["make-synthetic-corpus", "--out", out, "--pairs", "300", "--val-pairs", "20", "--test-pairs", "20",
            f"data.root={multi30k_dir}"]
    code, stdout, stderr = command(*args)
    assert code == 0, stderr.decode()
    german, english = (set(side) for side in read_split(multi30k_dir, "train", "de", "en"))

    def two_of(line: str, sentences: set[str]) -> bool:
        words = line.split(" ")
        return any(" ".join(words[:i]) in sentences and " ".join(words[i:]) in sentences for i in range(1, len(words)))

    de, en = read(out / "train.de"), read(out / "train.en")
    assert len(de) == len(en) == 300 and len(read(out / "val.de")) == len(read(out / "test.en")) == 20
    assert all(two_of(line, german) for line in de) and all(two_of(line, english) for line in en)
    assert not any(two_of(line, english) for line in de[:20])
    code, _, stderr = command(*args)  # again: refused, the corpus kept
    assert code == 2 and stderr.decode().startswith(f"error: {out / 'train.de'} already exists")
    assert read(out / "train.de") == de


# ---------------------------------------------------------------- the goals, the marks, a command measured


def test_goals_are_judged_from_the_measured_figures():
    figures = {"prepare_seconds": 612.0, "prepare_memory_gb": 3.99, "start_seconds": None, "train_memory_gb": 3.0}
    judged = judge(figures)
    assert [g["figure"] for g in judged] == [g.figure for g in GOALS]
    assert [g["value"] for g in judged] == [612.0, 3.99, None, 3.0]
    assert [g["met"] for g in judged] == [False, True, False, True]  # None: the command never got there
    assert judge({"prepare_seconds": 1.0})[1]["met"] is False  # a figure not measured is not met


def test_the_marks_are_seconds_from_the_launch_to_the_first_records(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    marks = training_marks(metrics)
    assert marks(1000.0) == {}  # no file yet
    metrics.write_text(json.dumps({"kind": "start", "startup_seconds": 1.5, "time": 1004.0}) + "\n")
    assert marks(1000.0) == {"start_seconds": 4.0, "startup_seconds": 1.5}
    metrics.write_text(metrics.read_text() + "".join(json.dumps({"kind": "train", "step": s, "time": 1005.0 + s}) + "\n"
                                                     for s in (1, 2)) + '{"kind": "tra')  # a torn last line
    assert marks(1000.0) == {"start_seconds": 4.0, "startup_seconds": 1.5, "first_step_seconds": 6.0}


ALLOCATE = ("import time\nb = bytearray(300 * 2**20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
            "print('allocated', flush=True)\ntime.sleep(1.5)\n")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["command", "its child"])
def test_a_commands_memory_counts_its_processes_together(tmp_path, where):
    code = ALLOCATE if where == "command" else (
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {ALLOCATE!r}], check=True)\n")
    lines = []
    m = run_measured([sys.executable, "-c", code], tmp_path / "logs", 60, echo=lines.append)
    assert m.ok and not m.timed_out and m.error is None
    assert m.peak_largest_gb >= 0.29  # the kernel's high-water mark of the largest process, children included
    assert m.peak_sampled_gb >= 0.25  # sampled while it slept, wherever in the tree it was
    assert m.peak_memory_gb == max(m.peak_sampled_gb, m.peak_largest_gb)
    assert lines == ["allocated"] and m.seconds >= 1.5


@pytest.mark.slow
def test_a_command_past_its_time_is_stopped_with_its_children(tmp_path):
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\ntime.sleep(60)\n")
    m = run_measured([sys.executable, "-c", code], tmp_path / "logs", 2.0)
    assert m.timed_out and m.exit_code is None and not m.ok and m.error == "stopped after 2 s"
    child = Path(f"/proc/{int((tmp_path / 'logs.out').read_text())}/stat")

    def running() -> bool:  # gone, or a zombie waiting for whoever adopted it
        try:
            return child.read_text().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False

    for _ in range(50):  # the child, in the command's session, was stopped too
        if not running():
            break
        time.sleep(0.1)
    assert not running()


@pytest.mark.slow
def test_a_failed_command_gives_its_last_line(tmp_path):
    m = run_measured([sys.executable, "-c", "import sys; print('working'); sys.exit('error: no such thing')"],
                     tmp_path / "logs", 60)
    assert m.exit_code == 1 and not m.ok and m.error == "error: no such thing"


# ---------------------------------------------------------------- benchmark --scale


@pytest.mark.parametrize("args, needle", [
    (["--pairs", "0"], "--pairs must be at least 1, got 0"),
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["data.dataset=files", "data.train=x/train", "data.val=x/val", "data.src_lang=fr"],
     "--scale's corpus is German and English; the config translates fr->en"),
])
def test_scale_bad_input_is_one_line_before_any_work(args, needle, command, tmp_path):
    code, stdout, stderr = command("benchmark", "--config", "tiny", "--scale", "--data-dir", tmp_path / "d", *args)
    lines = stderr.decode().splitlines()
    assert code == 2 and stdout == b"" and len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "d").exists()


def test_an_earlier_scale_json_is_refused_before_anything_is_measured(tmp_path, command):
    (tmp_path / "scale.json").write_text("{}\n")
    code, _, stderr = command("benchmark", "--config", "tiny", "--scale", "--data-dir", tmp_path / "d", "--out",
                              tmp_path)
    assert code == 2 and stderr.decode().startswith(f"error: {tmp_path / 'scale.json'} already exists")
    assert not (tmp_path / "d").exists() and (tmp_path / "scale.json").read_text() == "{}\n"


@pytest.mark.slow
def test_scale_benchmark_end_to_end_on_2000_pairs(multi30k_dir, tmp_path, command, monkeypatch):
    """prepare-data and train as processes on a small corpus with a tiny model: the JSON's figures, and the goals
    judged from them."""
    monkeypatch.setattr(scale_benchmark, "CorpusSpec", lambda pairs: CorpusSpec(pairs, 200, 200))  # a small val
    data, out = tmp_path / "data", tmp_path / "out"
    code, stdout, stderr = command(
        "benchmark", "--config", "tiny", "--scale", "--pairs", "2000", "--data-dir", data, "--steps", "2",
        "--out", out, "--json", f"data.root={multi30k_dir}", "data.tokenizer=spm", "data.spm_vocab_size=500",
        "train.precision=fp32", "train.device=cpu", "train.malloc=system")
    assert code == 0, stderr.decode()
    result = json.loads(stdout)
    assert json.loads((out / "scale.json").read_text()) == result
    assert result["benchmark"] == "scale" and result["config"] == "tiny" and result["steps"] == 2
    assert result["cores"] >= 1 and result["threads"] >= 1 and result["memory_gb"] > 0
    assert {"avx512_bf16", "amx", "avx2", "machine", "cpu", "torch", "date"} <= result.keys()
    corpus = result["corpus"]
    assert corpus["made"] and corpus["pairs"] == 2000 and corpus["folder"] == str(data)
    assert len(read(data / "train.de")) == 2000 and (data / "corpus.json").is_file()
    assert [p.name for p in data.iterdir() if p.name.startswith("scale-benchmark-")] == []  # cache and run deleted
    prepare, train = result["prepare"], result["train"]
    assert prepare["exit_code"] == 0 and prepare["stats"]["splits"]["train"] == 2000
    assert "prepare-data" in prepare["command"] and "data.cache_dir=" in prepare["command"]
    assert train["exit_code"] == 0 and "train.max_steps=2" in train["command"]
    assert 0 < train["start_seconds"] <= train["first_step_seconds"] <= train["seconds"]
    for m in (prepare, train):
        assert m["seconds"] > 0 and m["peak_memory_gb"] == max(m["peak_sampled_gb"], m["peak_largest_gb"]) > 0.05
    measured = {"prepare_seconds": prepare["seconds"], "prepare_memory_gb": prepare["peak_memory_gb"],
                "start_seconds": train["start_seconds"], "train_memory_gb": train["peak_memory_gb"]}
    for goal in result["goals"]:
        assert goal["value"] == measured[goal["figure"]]
        assert goal["met"] == (goal["value"] <= goal["at_most"])
