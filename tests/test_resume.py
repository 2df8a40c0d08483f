"""Resuming: what a run directory holds decides start, resume or finished; what may change on a resume.

The bit-exact SIGTERM-then-resume test is in test_trainer.py (test_sigterm_mid_epoch_then_resume_is_bit_identical).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.errors import CheckpointError
from annotated_transformer.harness.checkpointing import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "copy.yaml"]
# a short copy run with dropout, so the RNG state has to be restored too
SHORT = ["train.epochs=3", "data.copy_batches=40", "data.copy_batch_size=32", "model.dropout=0.1",
         "train.log_every=1", "train.progress=false"]


def run(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*TRAIN, *SHORT, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300, **kw)


@pytest.mark.slow
def test_resume_refuses_a_different_model(tmp_path):
    out = tmp_path / "r"
    assert run([f"train.out_dir={out}", "train.epochs=1"]).returncode == 0
    bad = run([f"train.out_dir={out}", "train.resume=true", "model.d_ff=128"])
    assert bad.returncode == 2 and "model settings differ (d_ff)" in bad.stderr
    missing = run([f"train.out_dir={tmp_path / 'none'}", "train.resume=true"])
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.slow
def test_resume_takes_the_optimizer_settings_given_now(tmp_path):
    """Adam's betas and eps, the lr factor and the warm-up of the resuming command win over last.pt's."""
    import json

    from annotated_transformer.optim import rate

    out = tmp_path / "r"
    assert run([f"train.out_dir={out}", "train.epochs=1"]).returncode == 0
    given = ["train.epochs=2", "train.lr_factor=0.1", "train.warmup=50", "train.adam_betas=[0.8,0.9]",
             "train.adam_eps=1e-6"]
    resumed = run([f"train.out_dir={out}", *given])
    assert resumed.returncode == 0 and f"resumed {out / 'last.pt'}" in resumed.stdout, resumed.stderr
    group = load_checkpoint(out / "last.pt")["optimizer"]["param_groups"][0]
    assert tuple(group["betas"]) == (0.8, 0.9) and group["eps"] == 1e-6
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    after = [r for r in records if r.get("kind") == "train" and r["step"] > 40]
    assert len(after) == 40  # log_every=1: every step of epoch 2, at the new schedule's rate
    assert all(r["lr"] == pytest.approx(rate(r["step"], 128, 0.1, 50)) for r in after)


@pytest.mark.slow
def test_resume_may_move_the_data_but_not_change_it(tmp_path):
    out = tmp_path / "r"
    assert run([f"train.out_dir={out}", "train.epochs=1"]).returncode == 0
    moved = run([f"train.out_dir={out}", "train.epochs=2", f"data.root={tmp_path / 'elsewhere'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "data.num_workers=1"])
    assert moved.returncode == 0 and f"resumed {out / 'last.pt'}" in moved.stdout, moved.stderr
    changed = run([f"train.out_dir={out}", "train.epochs=3", "data.copy_seq_len=12"])
    assert changed.returncode == 2 and "data settings differ (copy_seq_len)" in changed.stderr


@pytest.mark.slow
@pytest.mark.parametrize("max_steps, epoch", [(40, 1), (30, 0)])
def test_max_steps_on_an_epoch_end_completes_that_epoch(tmp_path, max_steps, epoch):
    out = tmp_path / "r"
    assert run([f"train.out_dir={out}", f"train.max_steps={max_steps}"]).returncode == 0  # 40 batches an epoch
    last = load_checkpoint(out / "last.pt")
    assert last["train_state"]["step"] == max_steps and last["train_state"]["epoch"] == epoch
    assert (last["loader"] is None) == (epoch == 1)  # a finished epoch needs no data position
    assert (out / "epoch_01.pt").is_file() == (epoch == 1)


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
    with pytest.raises(CheckpointError, match="not found"):
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

    with pytest.raises(RuntimeError):
        save_checkpoint({"model": {"w": torch.ones(3)}, "bad": Boom()}, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left behind


# --------------------------------------------------------------------------- train.resume=auto


def plan_of(out, *overrides):
    from annotated_transformer.config_loading import load_config
    from annotated_transformer.harness.run_dir import RunDir

    cfg = load_config("copy", [*SHORT, f"train.out_dir={out}", *overrides])
    return RunDir(out).plan(cfg)[0]


def test_resume_setting_takes_auto_true_and_false_only():
    from annotated_transformer.config_loading import load_config
    from annotated_transformer.errors import ConfigError

    assert load_config("copy").train.resume == "auto"
    assert load_config("copy", ["train.resume=true"]).train.resume is True
    assert load_config("copy", ["train.resume=false"]).train.resume is False
    with pytest.raises(ConfigError, match="train.resume must be one of 'auto', true, false; got 'maybe'"):
        load_config("copy", ["train.resume=maybe"])


@pytest.mark.slow
def test_auto_resume_decides_from_what_the_folder_holds(tmp_path):
    from annotated_transformer.errors import ConfigError

    out = tmp_path / "r"
    assert plan_of(out) == "start"  # absent
    out.mkdir()
    assert plan_of(out) == "start"  # empty
    (out / "config.yaml").write_text("x")
    (out / "metrics.jsonl").write_text("")
    assert plan_of(out) == "start"  # died before its first checkpoint: starts again
    assert run([f"train.out_dir={out}", "train.epochs=1"]).returncode == 0
    assert plan_of(out) == "resume"  # one of three epochs done
    assert plan_of(out, "train.epochs=1") == "finished"
    assert plan_of(out, "train.epochs=1", "train.resume=true") == "resume"  # true keeps its meaning
    assert plan_of(out, "train.overwrite=true") == "start"
    with pytest.raises(ConfigError, match="already holds a run"):
        plan_of(out, "train.resume=false")
    with pytest.raises(ConfigError, match=r"its model settings differ \(d_ff\)"):
        plan_of(out, "model.d_ff=64")
    (out / "last.pt").unlink()
    with pytest.raises(ConfigError, match="holds files but no last.pt, so it cannot be continued"):
        plan_of(out)


@pytest.mark.slow
def test_rerunning_after_a_stop_continues_and_a_finished_run_is_left_alone(tmp_path):
    out = tmp_path / "r"
    first = run([f"train.out_dir={out}", "train.epochs=1"])
    assert first.returncode == 0
    second = run([f"train.out_dir={out}", "train.epochs=2"])
    assert second.returncode == 0 and f"resumed {out / 'last.pt'}: epoch 1, step 40" in second.stdout
    again = run([f"train.out_dir={out}", "train.epochs=2"])
    assert again.returncode == 0 and "holds a finished run (2 epochs, 80 steps)" in again.stdout
    assert "resumed" not in again.stdout
