"""Steps as the unit of a long run: validation and checkpoints every N optimizer steps inside epochs, the exact
resume from a step checkpoint after a kill, averaging the last step files, and the run's budget in steps."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.checkpoints import load_checkpoint
from annotated_transformer.config import load_config
from annotated_transformer.harness.progress import run_length
from annotated_transformer.harness.run_dir import OWN_NAMES, RunDir
from annotated_transformer.harness.trainer import train_worker
from annotated_transformer.runtime.errors import ConfigError

from test_own_data import EXAMPLE, write_corpus
from test_run_folder import own_args

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["train.progress=false", "train.device=cpu", "train.precision=fp32"]
# the copy task, two epochs of ten steps, a model small enough that a step takes milliseconds
COPY = ["train.epochs=2", "data.copy_batches=10", "data.copy_batch_size=16", "model.N=1", "model.d_model=32",
        "model.d_ff=64", "train.log_every=2", "train.final_eval=false", *QUIET]


def records(run: Path, kind: str) -> list[dict]:
    """The metrics records of one kind ('step', 'epoch', ...) of a run folder."""
    return [r for r in RunDir(run).records() if r.get("kind") == kind]


# --------------------------------------------------------------------------- the keys and the folder


@pytest.mark.parametrize("key", ["val_every_steps", "save_every_steps", "keep_last_steps"])
def test_a_negative_step_cadence_is_refused_in_one_line(key):
    with pytest.raises(ConfigError, match=rf"^train\.{key} must not be negative, got -1$"):
        load_config("copy", [f"train.{key}=-1"])


def test_averaging_step_files_needs_that_many_kept():
    with pytest.raises(ConfigError, match=r"train.average_last \(6\) needs that many step checkpoints, but "
                                          r"train.keep_last_steps is 5; raise it or set it to 0"):
        load_config("copy", ["train.save_every_steps=100", "train.average_last=6"])
    # without step files the epoch files are averaged: keep_last_steps does not matter, keep_last_epochs does
    assert load_config("copy", ["train.average_last=6"]).train.average_last == 6
    with pytest.raises(ConfigError, match="needs that many epoch checkpoints"):
        load_config("copy", ["train.average_last=6", "train.keep_last_epochs=5"])
    assert load_config("copy", ["train.save_every_steps=100", "train.average_last=6", "train.keep_last_epochs=5",
                                "train.keep_last_steps=0"]).train.average_last == 6


def test_step_files_sort_by_name_belong_to_the_run_and_only_the_newest_are_kept(tmp_path):
    run = RunDir(tmp_path)
    assert run.step(4000).name == "step_0004000.safetensors" and run.step(999).name < run.step(4000).name
    assert OWN_NAMES.match("step_0004000.safetensors") and not OWN_NAMES.match("step_notes.safetensors")
    assert not OWN_NAMES.match("step_0004000.pt")  # no version of the project wrote step files in another form
    for step in (1000, 2000, 3000, 10_000):
        run.step(step).write_bytes(b"weights")
    (tmp_path / "step_0001000.pt").write_bytes(b"the user's, not the project's")
    (tmp_path / "step_best.safetensors").write_bytes(b"the user's")
    assert [s for s, _ in run.step_files()] == [1000, 2000, 3000, 10_000]
    run.prune_steps(3, newest=11_000)  # step 11,000's file is still being written: it counts among the 3
    assert [s for s, _ in run.step_files()] == [3000, 10_000]
    assert (tmp_path / "step_0001000.pt").is_file() and (tmp_path / "step_best.safetensors").is_file()
    run.prune_steps(1, newest=12_000)
    assert run.step_files() == []


def test_the_runs_length_says_its_steps_and_epochs():
    t = load_config("base", ["train.epochs=20"]).train
    assert run_length(t, 1100, 55) == "20 epochs (1,100 steps)"
    t = load_config("base", ["train.max_steps=100000"]).train
    assert run_length(t, 100_000, 60_000) == "100,000 steps (train.max_steps, 1.67 epochs)"


# --------------------------------------------------------------------------- a run with step cadences


@pytest.mark.slow  # a training of 20 steps with 8 validations (about 3 s on 2 cores)
def test_validation_and_checkpoints_happen_every_n_steps_and_the_last_step_files_are_averaged(tmp_path, capsys,
                                                                                              no_charts):
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", *COPY, "train.val_every_steps=3",
                               "train.save_every_steps=4", "train.keep_last_steps=3", "train.average_last=3"])
    train_worker(cfg)
    lines = capsys.readouterr().out.splitlines()
    # validation at every third step inside the epochs, the epochs' ends (10, 20) as before
    assert [(r["epoch"], r["step"]) for r in records(tmp_path, "step")] == [(1, 3), (1, 6), (1, 9), (2, 12),
                                                                            (2, 15), (2, 18)]
    assert [r["step"] for r in records(tmp_path, "epoch")] == [10, 20]
    assert all({"train_loss", "val_loss", "train_flops", "wall_seconds"} <= set(r) for r in records(tmp_path, "step"))
    # step files every fourth step (step 20's at the epoch's end), the newest three kept, and their average
    assert [s for s, _ in RunDir(tmp_path).step_files()] == [12, 16, 20]
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == ["epoch_01.safetensors", "epoch_02.safetensors"]
    weights = [load_checkpoint(tmp_path / f"step_{s:07d}.safetensors")["model"] for s in (12, 16, 20)]
    avg = load_checkpoint(tmp_path / "avg.safetensors")["model"]
    assert not torch.equal(weights[0]["generator.proj.weight"], weights[2]["generator.proj.weight"])
    for name, value in avg.items():
        torch.testing.assert_close(value, sum(w[name] for w in weights) / 3, rtol=0, atol=1e-6)
    assert load_checkpoint(tmp_path / "step_0000016.safetensors")["train_state"]["step"] == 16
    # the budget in steps and epochs, and the time left, on the first line, the log lines and the validations
    assert " | 2 epochs (20 steps) | run dir " in next(line for line in lines if "parameters" in line)
    logged = [line for line in lines if line.startswith("step ")]
    assert len(logged) == 10 and all(re.search(r" \| \d+% of 20 steps, (about \S+ \S+ left|time left unknown)$",
                                               line) for line in logged), logged
    assert logged[0].endswith("10% of 20 steps, " + logged[0].rsplit(", ", 1)[1])
    validations = [line for line in lines if line.startswith("validation at step")]
    assert validations[0].startswith("validation at step 3/20 (epoch 1) | train loss ")
    assert len(validations) == 6 and all(" left" in line for line in validations)
    assert any(line.startswith("epoch 1/2 | step 10/20 | train loss") for line in lines)


@pytest.mark.slow  # a translation run with BLEU at validations inside its epoch (seconds on 2 cores)
def test_bleu_at_every_nth_step_validation_picks_the_best_model_file(tmp_path, no_charts):
    overrides = [*own_args(write_corpus(tmp_path / "corpus"), tmp_path / "cache"), "train.epochs=1",
                 "train.val_every_steps=2", "train.bleu_every=2", "train.best_metric=bleu",
                 f"train.out_dir={tmp_path / 'run'}", "train.final_eval=false"]
    cfg = load_config(str(EXAMPLE), overrides)
    results = train_worker(cfg)
    run = tmp_path / "run"
    (end,) = records(run, "epoch")
    assert end["step"] >= 5 and "bleu" in end  # the run's end scores BLEU, as after the last epoch
    steps = records(run, "step")
    assert [(r["step"], "bleu" in r) for r in steps] == [(s, s % 4 == 0) for s in range(2, end["step"], 2)]
    scored = [r for r in steps + [end] if "bleu" in r]
    best = scored[0]
    for r in scored[1:]:  # the first BLEU makes the best; only a higher one replaces it
        best = r if r["bleu"] > best["bleu"] else best
    assert results["best_step"] == best["step"] and results["best_metric"] == pytest.approx(best["bleu"])
    assert load_checkpoint(run / "best.safetensors")["train_state"]["step"] == best["step"]


# --------------------------------------------------------------------------- killed, then resumed exactly

# The train command with one change: after optimizer step AT, once every checkpoint queued is on disk, the process
# sends itself SIGKILL (a crash that saves nothing). The step is fixed, so nothing depends on timing.
KILLED_TRAIN = """
import os, signal, sys
from annotated_transformer.cli import main
from annotated_transformer.harness.trainer import Trainer

at = int(sys.argv[1])
real_should_stop = Trainer._should_stop

def should_stop(self):
    if self.train_state.step == at:
        self.checkpoints.wait()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_should_stop(self)

Trainer._should_stop = should_stop
main(["train", *sys.argv[2:]])
"""


def without_clocks(record: dict) -> dict:
    """A record or train_state without its clocks (time stamps, durations, speeds), which no two runs share."""
    return {k: v for k, v in record.items() if k not in ("time", "tokens_per_s") and not k.endswith("seconds")}


def metrics_without_clocks(run: Path) -> list[dict]:
    """metrics.jsonl without clocks and without the start records (a resumed process logs its own)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [without_clocks(r) for r in map(json.loads, lines) if r.get("kind") != "start"]


@pytest.mark.slow
def test_a_run_killed_after_a_step_checkpoint_continues_there_as_if_never_killed(tmp_path):
    """SIGKILL inside epoch 2, after a step checkpoint, then the same command: it resumes at that step, and every
    metrics line, the weights, the Adam moments and the step files equal an uninterrupted run's (dropout on, so the
    random state is restored too)."""
    common = ["--config", str(EXAMPLE), *own_args(write_corpus(tmp_path / "corpus"), tmp_path / "cache"),
              "train.epochs=2", "model.dropout=0.1", "train.val_every_steps=3", "train.save_every_steps=4",
              "train.keep_last_steps=0", "train.average_last=2", "train.final_eval=false"]
    script = tmp_path / "killed_train.py"
    script.write_text(KILLED_TRAIN)

    def train(kill_at: int, out_dir: Path) -> subprocess.CompletedProcess:
        # Every run a fresh process (kill_at 0: never killed): what earlier tests left in this process's global
        # state (threads, kernel settings) cannot make the uninterrupted run differ from the killed one.
        return subprocess.run([sys.executable, str(script), str(kill_at), *common, f"train.out_dir={out_dir}"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)

    full = train(0, tmp_path / "full")
    assert full.returncode == 0, full.stdout[-3000:]
    per_epoch = int(full.stdout.split(" batches/epoch/rank")[0].rsplit("| ", 1)[1])
    saved = next(s for s in range(4, 2 * per_epoch, 4) if per_epoch < s < 2 * per_epoch - 1)  # inside epoch 2
    part = tmp_path / "part"
    killed = train(saved + 1, part)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    assert load_checkpoint(part / "last.pt")["train_state"]["step"] == saved  # what the kill left

    resumed = train(0, part)  # train.resume=auto
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resumed {part / 'last.pt'}: in epoch 2 at step {saved}" in resumed.stdout
    a, b = load_checkpoint(tmp_path / "full" / "last.pt"), load_checkpoint(part / "last.pt")
    assert without_clocks(a["train_state"]) == without_clocks(b["train_state"])
    assert a["train_state"]["step"] == 2 * per_epoch
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for moments_a, moments_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(moments_a["exp_avg"], moments_b["exp_avg"])
        assert torch.equal(moments_a["exp_avg_sq"], moments_b["exp_avg_sq"])
    # every metrics line: the validations inside epochs and the resumed epoch's train_loss over the whole epoch
    assert metrics_without_clocks(part) == metrics_without_clocks(tmp_path / "full")
    assert any(r["kind"] == "step" and r["step"] > saved for r in RunDir(part).records())
    names = sorted(p.name for p in part.glob("step_*"))
    assert names == sorted(p.name for p in (tmp_path / "full").glob("step_*")) and len(names) >= 3
    for name in names + ["avg.safetensors"]:
        full, resumed = (load_checkpoint(folder / name)["model"] for folder in (tmp_path / "full", part))
        assert all(torch.equal(full[k], resumed[k]) for k in full), name
