"""Resuming: what a run directory holds decides start, resume or finished; what may change on a resume.

The train command runs in this process (`annotated_transformer.cli.run`, what scripts/train.py runs), on one
short copy-task run trained once for the module and copied into each test. The bit-exact SIGTERM-then-resume
test is in test_trainer.py (test_sigterm_mid_epoch_then_resume_is_bit_identical).
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from annotated_transformer.cli import run as run_command
from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import CheckpointError, ConfigError, RunDirError
from annotated_transformer.checkpoints import load_checkpoint, save_checkpoint
from annotated_transformer.harness.run_dir import MARKER, RunDir
from annotated_transformer.harness.trainer import train_worker

BATCHES = 10  # copy batches an epoch: one optimizer step each
# a short copy run with dropout, so the RNG state has to be restored too
SHORT = ["train.epochs=3", f"data.copy_batches={BATCHES}", "data.copy_batch_size=32", "model.dropout=0.1",
         "train.log_every=1", "train.progress=false", "train.device=cpu"]


def train(capsys, out: Path, *args: str) -> tuple[int, str, str]:
    """`train --config copy.yaml SHORT train.out_dir=out ARGS` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run_command("train", ["--config", "copy.yaml", *SHORT, f"train.out_dir={out}", *args], "train.py")
    stdout, stderr = capsys.readouterr()
    return done.value.code, stdout, stderr


@pytest.fixture(scope="module")
def first_epoch(tmp_path_factory) -> Path:
    """A run that train.max_steps stopped exactly at the end of epoch 1 of 3 (trained once for the module)."""
    out = tmp_path_factory.mktemp("resume") / "r"
    train_worker(load_config("copy", [*SHORT, f"train.out_dir={out}", f"train.max_steps={BATCHES}"]))
    return out


@pytest.fixture
def stopped(first_epoch: Path, tmp_path: Path) -> Path:
    """This test's own copy of the first_epoch run."""
    out = tmp_path / "r"
    shutil.copytree(first_epoch, out)
    return out


def test_max_steps_on_an_epoch_end_completes_that_epoch_and_inside_one_does_not(first_epoch, tmp_path):
    last = load_checkpoint(first_epoch / "last.pt")
    assert last["train_state"]["step"] == BATCHES and last["train_state"]["epoch"] == 1
    assert last["loader"] is None  # a finished epoch needs no data position
    assert (first_epoch / "epoch_01.safetensors").is_file() and not (first_epoch / "epoch_01.json").exists()

    out = tmp_path / "cut"
    train_worker(load_config("copy", [*SHORT, f"train.out_dir={out}", f"train.max_steps={BATCHES - 3}"]))
    last = load_checkpoint(out / "last.pt")
    assert last["train_state"]["step"] == BATCHES - 3 and last["train_state"]["epoch"] == 0
    assert last["loader"] is not None and last["loader"]["taken"] == BATCHES - 3  # where the epoch goes on
    assert not list(out.glob("epoch_01*"))


def test_resume_refuses_a_different_model(stopped, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in stopped.iterdir() if p.is_file()}
    code, _, err = train(capsys, stopped, "train.resume=true", "model.d_ff=128")
    assert code == 2 and err.startswith("error: ") and "model settings differ (d_ff)" in err and err.count("\n") == 1
    saved = load_checkpoint(stopped / "last.pt")["config"]["model"]["d_ff"]
    assert f"resume with the run's own (model.d_ff={saved})" in err and saved != 128  # the override that resumes
    assert {p.name: p.read_bytes() for p in stopped.iterdir() if p.is_file()} == before  # nothing rewritten
    code, _, err = train(capsys, tmp_path / "none", "train.resume=true")
    assert code == 2 and f"{tmp_path / 'none' / 'last.pt'} does not exist" in err


@pytest.mark.slow  # about a second on 2 cores: the fast tier stays under a minute
def test_resume_takes_the_optimizer_settings_given_now_and_a_finished_run_is_left_alone(stopped, capsys):
    """Adam's betas and eps, the lr factor and the warm-up of the resuming command win over last.pt's; the same
    command again finds the run finished."""
    from annotated_transformer.optim import rate

    given = ["train.epochs=2", "train.lr_factor=0.1", "train.warmup=50", "train.adam_betas=[0.8,0.9]",
             "train.adam_eps=1e-6"]
    code, out, err = train(capsys, stopped, *given)  # train.resume=auto
    assert code == 0, err
    assert f"resumed {stopped / 'last.pt'}: after epoch 1 at step {BATCHES}" in out
    group = load_checkpoint(stopped / "last.pt")["optimizer"]["param_groups"][0]
    assert tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-6
    records = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines() if line.strip()]
    after = [r for r in records if r.get("kind") == "train" and r["step"] > BATCHES]
    assert [r["step"] for r in after] == list(range(BATCHES + 1, 2 * BATCHES + 1))  # log_every=1: all of epoch 2
    assert all(r["lr"] == pytest.approx(rate(r["step"], 128, 0.1, 50)) for r in after)  # at the new schedule's rate

    before = {p.name: p.stat().st_mtime_ns for p in stopped.iterdir()}
    code, out, err = train(capsys, stopped, *given)
    assert code == 0 and f"holds a finished run (2 epochs complete, {2 * BATCHES} steps)" in out, err
    assert "resumed" not in out
    assert {p.name: p.stat().st_mtime_ns for p in stopped.iterdir()} == before


def test_a_run_that_max_steps_ended_names_that_limit_to_continue_it(stopped, capsys):
    code, out, err = train(capsys, stopped, f"train.max_steps={BATCHES}")  # epochs=3: only the step limit is reached
    assert code == 0 and f"holds a finished run (1 epoch complete, {BATCHES} steps)" in out, err
    assert f"raise train.max_steps (now {BATCHES}) to continue it" in out and "train.epochs (now" not in out
    code, out, err = train(capsys, stopped, f"train.max_steps={BATCHES}", "train.epochs=1")  # both limits reached
    assert code == 0 and f"raise train.epochs (now 1) and train.max_steps (now {BATCHES}) to continue it" in out, err


@pytest.mark.slow  # about a second on 2 cores: the fast tier stays under a minute
def test_resume_may_move_the_data_but_not_change_it(stopped, tmp_path, capsys):
    code, out, err = train(capsys, stopped, "train.epochs=2", f"data.root={tmp_path / 'elsewhere'}",
                           f"data.cache_dir={tmp_path / 'cache'}", "data.num_workers=1")
    assert code == 0 and f"resumed {stopped / 'last.pt'}" in out, err
    assert load_checkpoint(stopped / "last.pt")["train_state"]["epoch"] == 2
    code, _, err = train(capsys, stopped, "train.epochs=3", "data.copy_seq_len=12")
    assert code == 2 and "data settings differ (copy_seq_len)" in err


def test_checkpoints_are_loaded_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("unpickled!",))

    bad = tmp_path / "evil.pt"
    torch.save({"format": "annotated-transformer/1", "model": {}, "x": Evil()}, bad)
    with pytest.raises(CheckpointError, match="needs arbitrary unpickling"):
        load_checkpoint(bad)
    trunc = tmp_path / "trunc.pt"
    good = tmp_path / "good.pt"
    save_checkpoint({"model": {"w": torch.ones(1000)}, "config": {}}, good)
    trunc.write_bytes(good.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        load_checkpoint(trunc)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {tmp_path / 'missing.pt'} not found")):
        load_checkpoint(tmp_path / "missing.pt")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.ones(2)}, other)
    with pytest.raises(CheckpointError, match="not an annotated-transformer checkpoint"):
        load_checkpoint(other)
    assert torch.equal(load_checkpoint(good)["model"]["w"], torch.ones(1000))


def test_atomic_save_leaves_the_old_file_on_failure(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"model": {"w": torch.zeros(3)}, "config": {}}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint({"model": {"w": torch.ones(3)}, "bad": Boom()}, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left behind


# --------------------------------------------------------------------------- train.resume=auto


def start_mode_of(out, *overrides):
    cfg = load_config("copy", [*SHORT, f"train.out_dir={out}", *overrides])
    return RunDir(out).start_mode(cfg)[0]


def test_resume_setting_takes_auto_true_and_false_only():
    assert load_config("copy").train.resume == "auto"
    assert load_config("copy", ["train.resume=true"]).train.resume is True
    assert load_config("copy", ["train.resume=false"]).train.resume is False
    with pytest.raises(ConfigError, match="train.resume must be one of 'auto', true, false; got 'maybe'"):
        load_config("copy", ["train.resume=maybe"])


def test_auto_resume_decides_from_what_the_folder_holds(stopped, tmp_path):
    fresh = tmp_path / "fresh"
    assert start_mode_of(fresh) == "start"  # absent
    fresh.mkdir()
    assert start_mode_of(fresh) == "start"  # empty
    (fresh / "config.yaml").write_text("x")
    (fresh / "metrics.jsonl").write_text('{"kind": "start"}\n')
    with pytest.raises(RunDirError, match="nothing shows that this project wrote them"):
        start_mode_of(fresh)  # names alone: anyone's
    (fresh / MARKER).write_text("{}")
    assert start_mode_of(fresh) == "start"  # a run that died before its first checkpoint: starts again
    (fresh / "metrics.jsonl").write_text('{"kind": "start"}\n{"kind": "epoch", "epoch": 1}\n')
    with pytest.raises(ConfigError, match="holds a run's files but no last.pt"):
        start_mode_of(fresh)  # it finished an epoch: its checkpoints were deleted, its records are kept

    out = stopped  # one of three epochs done
    assert start_mode_of(out) == "resume"
    assert start_mode_of(out, "train.epochs=1") == "finished"
    assert start_mode_of(out, "train.epochs=1", "train.resume=true") == "resume"  # true keeps its meaning
    assert start_mode_of(out, "train.overwrite=true") == "start"
    with pytest.raises(ConfigError, match="already holds a run"):
        start_mode_of(out, "train.resume=false")
    with pytest.raises(ConfigError, match=r"its model settings differ \(d_ff\)"):
        start_mode_of(out, "model.d_ff=64")
    (out / "last.pt").unlink()
    with pytest.raises(ConfigError, match="holds a run's files but no last.pt, so it cannot be continued"):
        start_mode_of(out)


@pytest.mark.slow  # two short tiny.yaml trainings: a few seconds
def test_a_resume_refused_when_its_data_position_is_restored_leaves_the_run_as_it_was(tiny_config, tmp_path):
    """Another train.seed inside a stopped epoch is refused only where the data position is restored, after the
    run's folder was taken: config.yaml (with the refused seed) and vocab/ were written before the refusal."""
    from annotated_transformer.runtime.errors import DataError

    out = tmp_path / "run"
    common = (f"train.out_dir={out}", "train.final_eval=false", "train.progress=false", "train.device=cpu")
    train_worker(tiny_config(*common, "train.max_steps=3"))  # ends inside epoch 1: its data position is saved

    def files() -> dict[str, bytes]:  # train.log records the refusal; every other file stays as it was
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
                if p.is_file() and p.name != "train.log"}

    before, mtimes = files(), {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert any(name.startswith("vocab/") for name in before) and "config.yaml" in before
    with pytest.raises(DataError, match=r"the saved data position is for train.seed=\d+, this run has 7"):
        train_worker(tiny_config(*common, "train.max_steps=6", "train.seed=7"))
    assert files() == before
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != "train.log"} == \
        {p: t for p, t in mtimes.items() if p.name != "train.log"}
