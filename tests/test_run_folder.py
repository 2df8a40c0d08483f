"""The run folder has one owner: what training may write into, what train.overwrite deletes, what a resume checks.

Each test is a situation a user meets: a folder holding a thesis, `runs/` holding other runs, a run folder with
the user's notes in it, training files edited between a run and its resume, a kill between two writes.
The train command runs in this process (`annotated_transformer.cli.run`, what scripts/train.py runs).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import shutil
import signal
from pathlib import Path

import pytest

from annotated_transformer.cli import run as run_command
from annotated_transformer.config import load_config
from annotated_transformer.harness.run_dir import MARKER, RunDir, check_same_data
from annotated_transformer.runtime import files
from annotated_transformer.runtime.errors import RunDirError, Terminated

from test_own_data import EXAMPLE, SMALL, french_pairs, made_up_pairs, write_corpus, write_split

# a copy-task run of two epochs of three steps: seconds on two cores
COPY = ["--config", "copy.yaml", "train.epochs=2", "data.copy_batches=3", "data.copy_batch_size=16",
        "model.N=1", "model.d_model=32", "model.d_ff=64", "train.log_every=1", "train.progress=false",
        "train.device=cpu", "train.precision=fp32"]


def train(capsys, *args: str) -> tuple[int, str, str]:
    """The train command in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run_command("train", [*map(str, args)], "train.py")
    out, err = capsys.readouterr()
    return done.value.code, out, err


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def thesis(tmp_path: Path) -> Path:
    """A user's folder: thesis.tex and a subfolder of figures."""
    folder = tmp_path / "my_thesis"
    (folder / "figures").mkdir(parents=True)
    (folder / "vocab").mkdir()
    (folder / "thesis.tex").write_text("\\documentclass{article}\n")
    (folder / "figures" / "plot.pdf").write_bytes(b"%PDF-1.4\n")
    # named like what training writes, or like its temporaries: still the user's
    (folder / ".lock").write_text("my own lock notes\n")
    (folder / ".train.log.backup.tmp").write_text("an old log\n")
    (folder / "vocab" / ".words.txt.mydraft.tmp").write_text("a draft\n")
    return folder


@pytest.mark.parametrize("extra", [[], ["train.overwrite=true"], ["train.resume=false"]])
def test_a_users_folder_is_refused_in_one_line_and_left_as_it_was(thesis, capsys, no_charts, extra):
    before = tree(thesis)
    code, out, err = train(capsys, *COPY, f"train.out_dir={thesis}", *extra)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{thesis} holds files this project did not write" in lines[0], err
    assert "thesis.tex" in lines[0] and "choose a new train.out_dir" in lines[0]
    assert "overwrite" not in lines[0]  # never the advice to delete a user's files
    assert tree(thesis) == before
    names = sorted(p.name for p in thesis.iterdir())
    assert names == [".lock", ".train.log.backup.tmp", "figures", "thesis.tex", "vocab"]


def test_a_folder_of_runs_is_never_cleared(tmp_path, capsys, no_charts):
    runs = tmp_path / "runs"
    assert train(capsys, *COPY, f"train.out_dir={runs / 'a'}")[0] == 0
    before = tree(runs)
    code, _, err = train(capsys, *COPY, f"train.out_dir={runs}", "train.overwrite=true")
    assert code == 2 and "holds files this project did not write (a)" in err
    assert tree(runs) == before


def test_overwrite_deletes_only_what_training_wrote(tmp_path, capsys, no_charts):
    out = tmp_path / "run"
    assert train(capsys, *COPY, f"train.out_dir={out}", "train.save_every_steps=2")[0] == 0
    assert (out / MARKER).is_file() and len(list(out.glob("step_*.safetensors"))) == 3  # steps 2, 4 and 6
    (out / "notes.txt").write_text("lr 1e-3 was worse\n")
    (out / "old_epoch_01.safetensors.bak").write_bytes(b"mine")
    (out / "my_thesis.beam5.txt").write_text("translated by hand\n")  # named like hypotheses, but not evaluate's
    (out / "best.test.beam1.txt").write_text("evaluate's hypotheses\n")
    (out / "epoch_1.safetensors").write_bytes(b"mine")  # not as training names epoch and step files
    (out / "step_123.safetensors").write_bytes(b"mine")
    (out / "charts").mkdir(exist_ok=True)
    (out / "charts" / "my_plot.svg").write_bytes(b"<svg/>")  # in a folder training writes, still the user's
    (out / "eval" / "other").mkdir(parents=True)
    (out / "eval" / "other" / MARKER).write_text("{}")  # a run of its own inside: never deleted with this one
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.overwrite=true", "train.epochs=1",
                              "--quiet")  # what is deleted is said all the same (it was not)
    assert code == 0, err
    said = f"train.overwrite: deleted the earlier run's files in {out} (best.safetensors, best.test.beam1.txt, "
    assert said in stdout
    assert (out / "notes.txt").read_text() == "lr 1e-3 was worse\n"
    assert (out / "old_epoch_01.safetensors.bak").read_bytes() == b"mine"
    assert ("kept what training did not write (charts, epoch_1.safetensors, eval, my_thesis.beam5.txt, notes.txt, "
            "old_epoch_01.safetensors.bak, step_123.safetensors)") in stdout
    assert (out / "my_thesis.beam5.txt").is_file() and not (out / "best.test.beam1.txt").exists()
    assert (out / "charts" / "my_plot.svg").read_bytes() == b"<svg/>" and (out / "eval" / "other" / MARKER).is_file()
    assert not (out / "epoch_02.safetensors").exists()  # the earlier run's second epoch is gone
    assert [p.name for p in out.glob("step_*")] == ["step_123.safetensors"]  # its step files gone, yours kept
    assert (out / "epoch_01.safetensors").is_file()


def test_overwrite_deletes_nothing_when_the_new_run_cannot_start(tiny_checkpoint, tmp_path, capsys, no_charts):
    """train.overwrite=true with a compile mode this device lacks, or data that fails to build: one line, and the
    trained run is still there (it was deleted first, then the start refused)."""
    out = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, out)
    before = tree(out)
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}", "train.overwrite=true", "train.compile=captured")
    assert code == 2 and "train.compile=captured replays CUDA graphs" in err and tree(out) == before, err
    corpus = tmp_path / "corpus"  # your own files, one line short on the English side: fails as it is read
    write_split(corpus / "train", "de", "en", [("Ein Hund.", "A dog."), ("Eine Katze.", "A cat.")])
    (corpus / "train.en").write_text("A dog.\n")
    write_split(corpus / "val", "de", "en", [("Ein Hund.", "A dog.")])
    own = ["--config", "tiny.yaml", "data.dataset=files", f"data.train={corpus / 'train'}",
           f"data.val={corpus / 'val'}", "data.src_lang=de", "data.tgt_lang=en", f"data.cache_dir={tmp_path / 'c'}"]
    code, _, err = train(capsys, *own, f"train.out_dir={out}", "train.overwrite=true")
    assert code == 2 and "train.de has 2 lines" in err and len(err.strip().splitlines()) == 1, err
    assert tree(out) == before


def test_overwrite_keeps_the_run_when_the_gpu_lacks_the_precision(tiny_checkpoint, tmp_path, capsys, monkeypatch,
                                                                   no_charts):
    """train.precision=bf16 on a GPU without bf16 (a V100, a T4) is refused before train.overwrite deletes anything."""
    import torch

    from annotated_transformer.harness import trainer
    from annotated_transformer.harness.distributed import DistInfo

    monkeypatch.setattr(trainer, "init_distributed", lambda spec: (DistInfo(0, 0, 1), torch.device("cuda", 0)))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    out = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, out)
    before = tree(out)
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}", "train.overwrite=true", "train.precision=bf16")
    assert code == 2 and "this GPU has no bf16 support; use train.precision=fp32" in err, err
    assert len(err.strip().splitlines()) == 1 and tree(out) == before


def test_an_overwrite_start_loads_its_data_once_and_logs_it(tmp_path, capsys, monkeypatch, no_charts):
    """The data checked before the folder is cleared is the data trained on: loaded once, its line in train.log."""
    from annotated_transformer import data as data_module

    corpus, out = write_corpus(tmp_path / "corpus"), tmp_path / "run"
    own = ["--config", str(EXAMPLE), *SMALL, f"data.train={corpus / 'train'}", f"data.val={corpus / 'val'}",
           "data.test=null", "data.src_lang=xx", "data.tgt_lang=yy", "data.spm_vocab_size=40",
           f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={out}", "train.max_steps=2",
           "train.final_eval=false"]
    assert train(capsys, *own)[0] == 0
    loads, load = [], data_module.load_translation_data
    monkeypatch.setattr(data_module, "load_translation_data", lambda *a, **k: loads.append(1) or load(*a, **k))
    code, stdout, err = train(capsys, *own, "train.overwrite=true")
    assert code == 0 and len(loads) == 1, err
    code, again, _ = train(capsys, *own)  # train.final_eval=false: finished all the same (it wrote no final record)
    assert code == 0 and "holds a finished run" in again
    assert sum("train 160" in line for line in stdout.splitlines()) == 1  # the data line, said once (it was twice)
    log = (out / "train.log").read_text().splitlines()
    assert sum("train 160" in line for line in log) == 1
    assert any(f"train.overwrite: deleted the earlier run's files in {out} (" in line for line in log)  # it was not


def test_a_run_finished_inside_an_epoch_says_where(tmp_path, capsys, no_charts):
    out = tmp_path / "run"  # three steps an epoch: train.max_steps=4 ends one step into epoch 2
    assert train(capsys, *COPY, f"train.out_dir={out}", "train.max_steps=4")[0] == 0
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.max_steps=4")
    assert code == 0 and "holds a finished run (step 4, in epoch 2)" in stdout, err
    assert "raise train.max_steps (now 4)" in stdout


@pytest.mark.slow  # eight short trainings: the fast tier stays under a minute
def test_a_run_stopped_in_its_final_evaluation_finishes_it_when_run_again(tmp_path, capsys, monkeypatch, no_charts):
    """Ctrl-C (or SIGTERM) while the trained run scores itself: one stop line naming the way on, and the same command
    again scores it (it said "holds a finished run" and never scored it); then it is finished."""
    from annotated_transformer.harness import trainer as trainer_module

    out, finish = tmp_path / "run", trainer_module.finish
    for stop, code, name in ((KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")):
        def stopped(tr, stop=stop):
            raise stop

        monkeypatch.setattr(trainer_module, "finish", stopped)
        got, stdout, err = train(capsys, *COPY, f"train.out_dir={out}")
        assert got == code and f"stopped by {name} at the end of training (step 6), before its final scores; the " \
            f"trained weights are saved in {out}; run the same command again to score them" in stdout, err
        assert not RunDir(out).has_final()
    monkeypatch.setattr(trainer_module, "finish", finish)
    save = trainer_module.Trainer.save

    def signalled_in_the_last_save(self, record):  # a SIGTERM while the last epoch validates and saves
        save(self, record)
        if self.done():
            self.stopper.signum = signal.SIGTERM

    monkeypatch.setattr(trainer_module.Trainer, "save", signalled_in_the_last_save)
    got, stdout, err = train(capsys, *COPY, f"train.out_dir={tmp_path / 'other'}")
    assert got == 143 and "stopped by SIGTERM at the end of training (step 6)" in stdout and "exact copies" not in \
        stdout, err  # not after the whole final evaluation
    monkeypatch.setattr(trainer_module.Trainer, "save", save)
    assert not RunDir(tmp_path / "other").has_final()
    got, stdout, err = train(capsys, *COPY, f"train.out_dir={out}")
    assert got == 0 and "exact copies:" in stdout and "holds a finished run" not in stdout, err
    assert RunDir(out).has_final()
    got, stdout, _ = train(capsys, *COPY, f"train.out_dir={out}")
    assert got == 0 and "holds a finished run" in stdout and "exact copies:" not in stdout
    monkeypatch.setattr(trainer_module, "finish", stopped)  # continued for a third epoch, stopped at its end again:
    got, stdout, _ = train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=3")  # the old end is not this one
    assert got == 143 and "at the end of training (step 9)" in stdout
    monkeypatch.setattr(trainer_module, "finish", finish)
    got, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=3")
    assert got == 0 and "exact copies:" in stdout and "holds a finished run" not in stdout, err
    assert [r["step"] for r in RunDir(out).records() if r.get("kind") == "final"] == [9]  # the old one dropped
    unscored = tmp_path / "unscored"  # train.final_eval=false: a finished run all the same, and said to be
    assert train(capsys, *COPY, f"train.out_dir={unscored}", "train.final_eval=false")[0] == 0
    got, stdout, _ = train(capsys, *COPY, f"train.out_dir={unscored}", "train.final_eval=false")
    assert got == 0 and "holds a finished run" in stdout


def test_a_run_of_an_older_version_without_the_marker_is_still_a_run(tmp_path, capsys, no_charts):
    out = tmp_path / "run"
    assert train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=1")[0] == 0
    (out / MARKER).unlink()
    assert RunDir(out).owned()
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}")  # continues it, and marks it
    assert code == 0 and "resumed" in stdout, err
    assert (out / MARKER).is_file()
    # a user's folder that happens to hold only a config.yaml is not a run: refused, the file kept
    mine = tmp_path / "experiment"
    mine.mkdir()
    (mine / "config.yaml").write_text("train:\n  epochs: 3\n")
    assert not RunDir(mine).owned()
    code, _, err = train(capsys, *COPY, f"train.out_dir={mine}")
    assert code == 2 and "named as a run's (config.yaml) but nothing shows that this project wrote them" in err
    assert (mine / "config.yaml").read_text() == "train:\n  epochs: 3\n"


@pytest.mark.parametrize("extra", [[], ["train.overwrite=true"]])
def test_another_tools_run_folder_is_not_taken_for_an_old_run(tmp_path, capsys, no_charts, extra):
    """Names alone do not make a run ours: another trainer's config.yaml, metrics.jsonl, train.log, TensorBoard
    events and even a last.pt, without the marker, are refused and kept, with train.overwrite too."""
    theirs = tmp_path / "their_run"
    (theirs / "tensorboard").mkdir(parents=True)
    (theirs / "config.yaml").write_text("lr: 0.1\n")
    (theirs / "metrics.jsonl").write_text('{"loss": 2.5, "step": 100}\n')
    (theirs / "train.log").write_text("epoch 1 done\n")
    (theirs / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"tb")
    for last in (None, b"another trainer's checkpoint"):
        if last is not None:
            (theirs / "last.pt").write_bytes(last)
        assert not RunDir(theirs).owned()
        before = tree(theirs)
        code, _, err = train(capsys, *COPY, f"train.out_dir={theirs}", *extra)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, err
        assert "nothing shows that this project wrote them" in lines[0] and "choose a new train.out_dir" in lines[0]
        assert "overwrite" not in lines[0]
        assert tree(theirs) == before


def test_a_finished_run_whose_model_files_were_deleted_keeps_its_records(tmp_path, capsys, no_charts):
    """Deleting a finished run's checkpoints to save space leaves what a run that died early holds by name; its
    records say otherwise, so the next start refuses (naming train.overwrite) instead of clearing them."""
    out = tmp_path / "run"
    assert train(capsys, *COPY, f"train.out_dir={out}")[0] == 0
    for model in [out / "last.pt", *out.glob("*.safetensors")]:
        model.unlink()
    assert RunDir(out).run_files() <= {"config.yaml", "metrics.jsonl", "train.log", "charts", "tensorboard"}
    before = tree(out)
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds a run's files but no last.pt" in err and "train.overwrite=true" in err
    assert tree(out) == before
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}", "train.overwrite=true")  # the advice works
    assert code == 0 and (out / "last.pt").is_file(), err


def test_temporaries_of_killed_writes_are_removed_at_the_next_start(tmp_path, capsys, no_charts):
    out = tmp_path / "run"
    assert train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=1")[0] == 0
    leftovers = [out / ".last.pt.k2j4x9ab.tmp", out / ".epoch_02.safetensors.q1w2e3r4.tmp"]
    leftovers[0].write_bytes(b"half a checkpoint")
    leftovers[1].write_bytes(b"half a model")
    mine = out / ".notes.txt.k2j4x9ab.tmp"  # named like one, but not for a file training writes
    mine.write_bytes(b"the user's")
    draft = out / "vocab" / ".words.txt.k2j4x9ab.tmp"  # nor in vocab/, whose files training writes by name
    draft.parent.mkdir(exist_ok=True)
    draft.write_bytes(b"the user's")
    leftovers.append(out / "vocab" / ".text_pipeline.json.q1w2e3r4.tmp")
    leftovers[-1].write_bytes(b"half a pipeline")
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}")
    assert code == 0 and "resumed" in stdout, err
    assert not leftovers[0].exists() and not leftovers[1].exists()
    assert mine.read_bytes() == b"the user's" and draft.read_bytes() == b"the user's"


class Killed(BaseException):
    """What a kill at one write looks like to the code: nothing after it runs (not even `except Exception`)."""


@pytest.mark.slow
def test_a_kill_at_any_write_leaves_a_folder_that_resumes(tmp_path, capsys, monkeypatch, no_charts):
    """Raise at the n-th atomic rename of a run, leaving its temporary as a kill would; the same command then
    continues or starts again, or (killed among the first epoch's files, before last.pt) is refused in one line
    whose advice works; every file ends whole."""
    real_replace = os.replace
    n_writes = 0

    def counting(src, dst):
        nonlocal n_writes
        n_writes += 1
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", counting)
    assert train(capsys, *COPY, f"train.out_dir={tmp_path / 'count'}")[0] == 0
    assert n_writes >= 6  # marker, config, vocab-less copy run: model files, last.pt, ...
    for kill_at in range(1, n_writes + 1):
        out = tmp_path / f"k{kill_at}"
        calls = 0

        def killing(src, dst):
            nonlocal calls
            calls += 1
            if calls == kill_at:
                shutil.copy(src, str(src)[:-4] + "zz.tmp")  # the temporary a real kill leaves behind
                raise Killed
            return real_replace(src, dst)

        monkeypatch.setattr(files.os, "replace", killing)
        with pytest.raises((Killed, SystemExit)) as stopped:
            run_command("train", [*COPY, f"train.out_dir={out}"], "train.py")
        assert stopped.type is Killed or stopped.value.code != 0  # the run did not finish past the kill
        monkeypatch.setattr(files.os, "replace", real_replace)
        code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}")
        if code == 2:  # killed while the first epoch's files were written: no last.pt to continue from
            assert not (out / "last.pt").exists() and len(err.strip().splitlines()) == 1, err
            assert "holds a run's files but no last.pt" in err and "train.overwrite=true" in err
            code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.overwrite=true")
        assert code == 0, f"killed at write {kill_at}: {err}"
        assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
        assert RunDir(out).owned() and (out / "best.safetensors").is_file()


# --------------------------------------------------------------------------- a resume checks its data


def edit_half(folder: Path, src: str = "xx", tgt: str = "yy", fewer: bool = False) -> None:
    """Replace half of the training pairs with others (or drop them, with `fewer`)."""
    lines = {lang: gzip.decompress((folder / f"train.{lang}.gz").read_bytes()).decode().splitlines()
             for lang in (src, tgt)}
    half = len(lines[src]) // 2
    make = made_up_pairs if src == "xx" else french_pairs
    others = [] if fewer else make(half, random.Random(7))
    write_split(folder / "train", src, tgt, list(zip(lines[src][:half], lines[tgt][:half])) + others, gz=True)


@pytest.mark.parametrize("tokenizer, fewer", [("spm", False), pytest.param("spm", True, marks=pytest.mark.slow),
                                               pytest.param("word", False, marks=pytest.mark.slow)],
                         ids=["spm, same line count", "spm, fewer lines", "word, same line count"])
def test_a_resume_on_edited_training_files_is_refused_before_anything_is_written(tmp_path, capsys, no_charts,
                                                                                 tokenizer, fewer):
    """In word mode too, where the vocabulary built from other files used to end in a cut-off state_dict error
    after vocab/ had been overwritten."""
    src, tgt = ("xx", "yy") if tokenizer == "spm" else ("fr", "en")
    corpus, cache, out = write_corpus(tmp_path / "corpus", src, tgt), tmp_path / "cache", tmp_path / "run"
    args = ["--config", str(EXAMPLE), *own_args(corpus, cache, src, tgt), f"train.out_dir={out}",
            "train.best_metric=loss", f"data.tokenizer={tokenizer}", "data.min_freq=1", "train.epochs=1",
            "train.bleu_every=0"]
    if tokenizer == "word":
        args.append("model.tie_embeddings=false")
    code, _, err = train(capsys, *args)
    assert code == 0, err
    before = tree(out)
    edit_half(corpus, src, tgt, fewer)
    code, stdout, err = train(capsys, *args, "train.epochs=2")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "its data files changed since it was written (" in lines[0] and str(corpus) in lines[0]
    assert f"train.{src} has other contents" in lines[0] and f"train.{tgt} has other contents" in lines[0]
    assert ("resume with the same files again, replace the run with train.overwrite=true, or start a new run with "
            "another train.out_dir") in lines[0]
    assert "process" not in lines[0]  # not the data position's message about processes
    after = tree(out)
    assert {k: v for k, v in after.items() if k != "train.log"} == {k: v for k, v in before.items() if k != "train.log"}


@pytest.mark.slow
def test_a_resume_streams_each_file_of_your_corpus_once(tmp_path, capsys, monkeypatch, no_charts):
    """The resume's check of the files and the data load share what was read: each file is hashed once."""
    from annotated_transformer.data import own_files

    corpus, cache, out = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "run"
    args = ["--config", str(EXAMPLE), *own_args(corpus, cache), f"train.out_dir={out}", "train.best_metric=loss",
            "train.epochs=1", "train.bleu_every=0"]
    code, _, err = train(capsys, *args)
    assert code == 0, err
    streamed: list[str] = []
    check_file = own_files.check_file
    monkeypatch.setattr(own_files, "check_file",
                        lambda path, *a: streamed.append(Path(path).name) or check_file(path, *a))
    code, stdout, err = train(capsys, *args, "train.epochs=2")
    assert code == 0, err
    assert "resumed" in stdout and "loaded from cache" in stdout
    assert sorted(streamed) == ["train.xx.gz", "train.yy.gz", "val.xx", "val.yy"]


def own_args(corpus: Path, cache: Path, src: str = "xx", tgt: str = "yy") -> list[str]:
    """examples/own_data.yaml's overrides for a small corpus of test_own_data's, as command-line words."""
    return [f"data.train={corpus / 'train'}", f"data.val={corpus / 'val'}", "data.test=null", f"data.src_lang={src}",
            f"data.tgt_lang={tgt}", "data.spm_vocab_size=40", f"data.cache_dir={cache}", *SMALL]


@pytest.mark.slow  # the fast tier stays under a minute; the fingerprint's own check is fast above
def test_an_older_last_pt_without_a_fingerprint_is_checked_by_its_tokenizer(tmp_path, capsys, no_charts):
    """A last.pt written before runs recorded their data: its vocabulary is compared with today's before vocab/ is
    written."""
    import torch

    from annotated_transformer.checkpoints import load_checkpoint, save_checkpoint

    corpus, cache, out = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "run"
    args = ["--config", str(EXAMPLE), *own_args(corpus, cache), f"train.out_dir={out}", "train.best_metric=loss",
            "train.epochs=1", "train.bleu_every=0"]
    assert train(capsys, *args)[0] == 0
    last = load_checkpoint(out / "last.pt")
    assert last["data"]["settings"]["data"]["train.xx"] and last["data"]["tokenizer"]
    del last["data"]
    save_checkpoint(last, out / "last.pt")
    vocab = tree(out / "vocab")
    edit_half(corpus)
    code, _, err = train(capsys, *args, "train.epochs=2")
    assert code == 2 and "the tokenizer built from today's data differs from the one it was trained with" in err
    assert tree(out / "vocab") == vocab
    assert isinstance(torch.load(out / "last.pt", weights_only=True), dict)


def test_the_same_files_moved_elsewhere_still_resume(tmp_path, capsys, no_charts):
    corpus, cache, out = write_corpus(tmp_path / "corpus"), tmp_path / "cache", tmp_path / "run"
    args = ["--config", str(EXAMPLE), *own_args(corpus, cache), f"train.out_dir={out}", "train.best_metric=loss",
            "train.epochs=1", "train.bleu_every=0"]
    assert train(capsys, *args)[0] == 0
    moved = corpus.rename(tmp_path / "moved")
    args = [a.replace(str(corpus), str(moved)) for a in args]
    code, stdout, err = train(capsys, *args, "train.epochs=2")
    assert code == 0 and "resumed" in stdout, err


@pytest.mark.slow  # two trainings: the fast tier stays under a minute
def test_a_test_split_added_or_edited_meanwhile_does_not_stop_a_resume(tmp_path, capsys, no_charts):
    """Nothing of training reads the test files: a test set added to a stopped run's config resumes (it was refused
    as "test.xx is new") and is scored at the end; a training file edited is still refused."""
    corpus, cache, out = write_corpus(tmp_path / "corpus", test=True), tmp_path / "cache", tmp_path / "run"
    args = ["--config", str(EXAMPLE), *own_args(corpus, cache), f"train.out_dir={out}", "train.best_metric=loss",
            "train.bleu_every=0"]
    assert train(capsys, *args, "train.epochs=1")[0] == 0
    with_test = [a for a in args if a != "data.test=null"] + [f"data.test={corpus / 'test'}"]
    code, stdout, err = train(capsys, *with_test, "train.epochs=2")
    assert code == 0 and "resumed" in stdout, err
    assert any(r.get("kind") == "final" and "test_bleu" in r for r in RunDir(out).records()), stdout
    (corpus / "test.yy").write_text("ein anderer Test\n" * 10)  # corrected: scored as it is now
    assert train(capsys, *with_test, "train.epochs=3")[0] == 0
    with gzip.open(corpus / "train.yy.gz", "at", encoding="utf-8") as f:
        f.write("one line more\n")
    with gzip.open(corpus / "train.xx.gz", "at", encoding="utf-8") as f:
        f.write("eine Zeile mehr\n")
    code, _, err = train(capsys, *with_test, "train.epochs=4")
    assert code == 2 and "its data files changed since it was written (train.xx has other contents" in err, err


def test_a_run_folder_check_fires_before_deleting_even_when_called_directly(thesis):
    """`prepare` refuses a folder it does not own even if a caller skipped `start_mode`."""
    cfg = load_config("copy", [f"train.out_dir={thesis}", "train.overwrite=true"])
    with pytest.raises(RunDirError, match="holds files this project did not write"):
        RunDir(thesis).prepare(cfg, "start")
    assert (thesis / "thesis.tex").is_file()


def test_a_wrong_multi30k_folder_is_one_line_before_the_run_folder_is_made(tmp_path, capsys):
    """data.root naming no folder, or one without Multi30k's files: one line, and no run folder (config.yaml, the
    marker and train.log were left in it, as a run that died early)."""
    (tmp_path / "empty").mkdir()
    for root, said in ((tmp_path / "nothing", "which is not a folder"), (tmp_path / "empty", "train.de.gz")):
        out = tmp_path / "runs" / "2026" / "run"
        code, _, err = train(capsys, "--config", "tiny.yaml", f"data.root={root}", f"train.out_dir={out}",
                             "train.device=cpu")
        assert code == 2 and said in err and len([line for line in err.splitlines() if line.strip()]) == 1, err
        assert not (tmp_path / "runs").exists()


def test_a_missing_corpus_file_is_one_line_before_the_run_folder_is_made(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "val.yy").unlink()
    out = tmp_path / "run"
    code, _, err = train(capsys, "--config", EXAMPLE, *own_args(corpus, tmp_path / "cache"), f"train.out_dir={out}")
    assert code == 2 and "val.yy" in err and len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_open_makes_the_folder_the_runs_and_leaves_a_finished_run_untouched(tmp_path, capsys, no_charts):
    """`RunDir.open` is the one step that takes a folder: locked, decided and, to start or resume, made the run's
    (the marker; config.yaml once the run has begun); a finished run's folder is left byte for byte."""
    from annotated_transformer.harness.distributed import DistInfo

    out = tmp_path / "run"
    cfg = load_config("copy", [f"train.out_dir={out}", *COPY[2:]])
    run = RunDir(out)
    assert run.open(cfg, DistInfo())[0] == "start"
    assert run.owned() and run.lock_file.is_file() and not run.config.exists()
    run.unlock()
    assert train(capsys, *COPY, f"train.out_dir={out}")[0] == 0
    before = tree(out)
    assert run.open(cfg, DistInfo())[0] == "finished"
    run.unlock()
    assert tree(out) == before


# --------------------------------------------------------------------------- writes that fail, fail at once


@pytest.mark.parametrize("errname", ["ENOSPC", pytest.param("EACCES", marks=pytest.mark.slow)])
def test_a_failed_background_write_stops_the_run_within_a_step(tmp_path, capsys, monkeypatch, no_charts, errname):
    """The writer fails on epoch 2's files (a full disk, a permission taken away); the run stops in epoch 3's first
    steps (not at its end), in one line that names the last good checkpoint, which is still whole."""
    import errno
    import json

    from annotated_transformer import checkpoints

    write = checkpoints.write_checkpoint

    def full_disk(payload, path):
        if payload["train_state"]["step"] == 12:
            raise OSError(getattr(errno, errname), os.strerror(getattr(errno, errname)), str(path))
        return write(payload, path)

    monkeypatch.setattr(checkpoints, "write_checkpoint", full_disk)
    queue = checkpoints.CheckpointWriter.save

    def queue_and_settle(self, *jobs, **then):  # the failed write is over before step 13: the test races no thread
        queue(self, *jobs, **then)
        if any(payload["train_state"]["step"] == 12 for payload, _ in jobs):
            self._thread.join()

    monkeypatch.setattr(checkpoints.CheckpointWriter, "save", queue_and_settle)
    out = tmp_path / "run"
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=3", "data.copy_batches=6",
                         "train.keep_last_epochs=1")
    assert code == 2
    assert (out / "epoch_01.safetensors").is_file()  # kept: its successor never reached the disk
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    if errname == "ENOSPC":
        assert "No space left on device" in lines[0]
        assert f"resume from {out / 'last.pt'}, which is intact; it holds step 6" in lines[0]
    else:
        assert "Permission denied" in lines[0]
        assert f"the last good checkpoint is {out / 'last.pt'} (step 6)" in lines[0]
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "step" in r]
    assert max(steps) == 13  # the first step after the failure, not the end of epoch 3 (step 18)
    monkeypatch.setattr(checkpoints, "write_checkpoint", write)
    monkeypatch.setattr(checkpoints.CheckpointWriter, "save", queue)
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=3", "data.copy_batches=6",
                              "train.keep_last_epochs=1")
    assert code == 0 and "resumed" in stdout and "step 6" in stdout, err
    assert [p.name for p in sorted(out.glob("epoch_*"))] == ["epoch_03.safetensors"]  # pruned once written


def test_an_old_model_file_that_cannot_be_deleted_is_a_warning(tmp_path, capsys, monkeypatch, no_charts):
    """train.keep_last_epochs deletes after the new files landed; a refusal to delete is one warning, not a stop."""
    def refused(self, keep_after):
        raise RunDirError(f"cannot delete the older model file {self.epoch(keep_after)}: Permission denied")

    monkeypatch.setattr(RunDir, "prune_epochs", refused)
    out = tmp_path / "run"
    code, stdout, err = train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=3", "train.keep_last_epochs=1")
    assert code == 0, err
    warnings = [line for line in (stdout + err).splitlines() if "training goes on, the older model files stay" in line]
    assert len(warnings) == 3 and "Permission denied" in warnings[0]  # after each epoch
    assert (out / "last.pt").is_file() and (out / "epoch_03.safetensors").is_file()


@pytest.mark.parametrize("craft, message", [
    (lambda p: {**p, "config": [1, 2]}, "its config is not a mapping"),
    (lambda p: {**p, "train_state": "x"}, "its train_state is not a mapping"),
    (lambda p: {**p, "train_state": {**p["train_state"], "step": "3"}}, "its epoch and step are not whole numbers"),
    (lambda p: {**p, "data": [1]}, "its data fingerprint is not one this project writes"),
    pytest.param(lambda p: {**p, "data": {"settings": {"data": [1]}}},
                 "its data fingerprint is not one this project writes", marks=pytest.mark.slow),
    pytest.param(lambda p: {**p, "data": {"settings": {"data": {"train.de": 3}}}},
                 "its data fingerprint is not one this project writes", marks=pytest.mark.slow),
], ids=["config a list", "train_state a string", "step a string", "data a list", "files a list", "sha a number"])
def test_a_crafted_last_pt_is_one_line_and_changes_nothing(tmp_path, capsys, no_charts, craft, message):
    from annotated_transformer.checkpoints import load_checkpoint, save_checkpoint

    out = tmp_path / "run"
    assert train(capsys, *COPY, f"train.out_dir={out}", "train.epochs=1")[0] == 0
    save_checkpoint(craft(load_checkpoint(out / "last.pt")), out / "last.pt")
    before = tree(out)
    code, _, err = train(capsys, *COPY, f"train.out_dir={out}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and f"{out / 'last.pt'} cannot be resumed: {message}" in lines[0], err
    assert tree(out) == before


def test_a_last_pt_of_the_older_cache_format_resumes_but_not_one_of_another_tokenizer(tmp_path):
    """The cache's format version says how the ids are stored, not which ids: a run begun before it changed resumes."""
    from annotated_transformer.data.cache import CACHE_FORMAT, cache_settings

    d = load_config("cpu_15min", []).data
    now = {"settings": cache_settings(d, {"train.de": "a" * 64}), "location": str(tmp_path)}
    older = {"settings": {**now["settings"], "format": CACHE_FORMAT - 1}, "location": str(tmp_path)}
    check_same_data(older, now, tmp_path / "last.pt")  # no error
    other = {"settings": {**now["settings"], "spm_vocab_size": 16000}, "location": str(tmp_path)}
    with pytest.raises(RunDirError, match="spm_vocab_size 16000 -> 8000"):
        check_same_data(other, now, tmp_path / "last.pt")
