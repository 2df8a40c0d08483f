"""Background checkpoint writes, keeping only the last epochs, and averaging them at the end of training."""

from __future__ import annotations

import re

import pytest
import torch

from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import ConfigError, RunDirError
from annotated_transformer.checkpoints import CheckpointWriter, load_checkpoint
from annotated_transformer.harness.run_dir import RunDir
from annotated_transformer.harness.trainer import train_worker


def test_writer_snapshots_the_payload_when_save_is_called(tmp_path):
    writer = CheckpointWriter()
    weights = torch.zeros(100_000)
    writer.save(({"model": {"w": weights}, "config": {}}, [tmp_path / "a.pt", tmp_path / "b.pt"]))
    weights.add_(1.0)  # training goes on while the bytes are written
    writer.wait()
    for name in ("a.pt", "b.pt"):
        assert torch.equal(load_checkpoint(tmp_path / name)["model"]["w"], torch.zeros(100_000))
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()  # one file, copied


def test_writes_land_in_order_and_a_failed_write_reaches_wait(tmp_path):
    writer = CheckpointWriter()
    path = tmp_path / "c.pt"
    for i in range(3):
        writer.save(({"model": {"w": torch.full((10,), float(i))}, "config": {}}, [path]))
    writer.wait()
    assert load_checkpoint(path)["model"]["w"][0] == 2.0

    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    writer.save(({"model": {}, "config": {}}, [blocker / "d.pt"]))  # its parent is a file: fails in the thread
    with pytest.raises(RunDirError, match=r"cannot write .*not_a_folder.*: .*; "):
        writer.wait()
    writer.wait()  # reported once, then cleared
    assert load_checkpoint(path)["model"]["w"][0] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "not_a_folder"]  # no temporary files


def test_what_follows_a_save_runs_only_once_its_files_are_on_disk(tmp_path):
    """`then` (deleting older files) runs after the writes have landed, and never after a write that failed."""
    writer, seen = CheckpointWriter(), []
    path = tmp_path / "e.pt"
    writer.save(({"model": {"w": torch.ones(3)}, "config": {}}, [path]), then=lambda: seen.append(path.is_file()))
    writer.wait()
    assert seen == [True]
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    writer.save(({"model": {}, "config": {}}, [blocker / "f.pt"]), then=lambda: seen.append("ran"))
    with pytest.raises(RunDirError):
        writer.wait()
    assert seen == [True]


def test_one_save_copies_shared_weights_once_and_writes_every_job(tmp_path):
    writer = CheckpointWriter()
    weights = {"w": torch.arange(10.0)}
    writer.save(({"model": weights, "config": {}}, [tmp_path / "best.pt"]),
                ({"model": weights, "config": {}, "optimizer": {"lr": 1.0}}, [tmp_path / "last.pt"]))
    weights["w"].zero_()
    writer.wait()
    assert torch.equal(load_checkpoint(tmp_path / "best.pt")["model"]["w"], torch.arange(10.0))
    last = load_checkpoint(tmp_path / "last.pt")
    assert torch.equal(last["model"]["w"], torch.arange(10.0)) and last["optimizer"] == {"lr": 1.0}


def test_prune_epochs_keeps_only_the_newest(tmp_path):
    run = RunDir(tmp_path)
    for epoch in range(1, 6):
        run.epoch(epoch).write_bytes(b"x")
        run.epoch(epoch).with_suffix(".json").write_bytes(b"{}")
    (tmp_path / "epoch_02.pt").write_bytes(b"x")  # an older version's epoch file, pruned alike
    run.best.write_bytes(b"b")
    run.prune_epochs(keep_after=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.safetensors", "epoch_04.json", "epoch_04.safetensors",
                                                          "epoch_05.json", "epoch_05.safetensors"]
    for epoch in (99, 100, 101):  # three digits sort after two: by number, not by name
        run.epoch(epoch).write_bytes(b"x")
    (tmp_path / "epoch_102.pt").write_bytes(b"x")
    assert [e for e, _ in run.epoch_files()] == [4, 5, 99, 100, 101, 102]
    run.prune_epochs(keep_after=99)
    assert [p.name for _, p in run.epoch_files()] == ["epoch_100.safetensors", "epoch_101.safetensors", "epoch_102.pt"]


def test_pruning_deletes_only_training_s_own_numbered_files(tmp_path):
    """keep_last_epochs / keep_last_steps delete epoch_NN and step_NNNNNNN files (and an older version's forms of an
    epoch's); a file of yours named like one but numbered otherwise, or of another kind, stays."""
    run = RunDir(tmp_path)
    for epoch in (1, 2, 3):
        run.epoch(epoch).write_bytes(b"x")
    for step in (100, 200, 300):
        run.step(step).write_bytes(b"x")
    mine = ["epoch_1.safetensors", "epoch_001.json", "epoch_02.txt", "step_100.safetensors", "step_0000100.pt"]
    for name in mine:
        (tmp_path / name).write_bytes(b"the user's")
    run.prune_epochs(keep_after=2)
    run.prune_steps(1, newest=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["epoch_03.safetensors", "step_0000300.safetensors", *mine])
    assert all((tmp_path / name).read_bytes() == b"the user's" for name in mine)


def test_average_last_needs_enough_kept_epochs():
    with pytest.raises(ConfigError, match="train.average_last .5. needs that many epoch checkpoints"):
        load_config("copy", ["train.keep_last_epochs=3", "train.average_last=5"])
    with pytest.raises(ConfigError, match="train.keep_last_epochs must not be negative"):
        load_config("copy", ["train.keep_last_epochs=-1"])
    assert load_config("copy", ["train.keep_last_epochs=0", "train.average_last=5"]).train.average_last == 5


@pytest.mark.slow
def test_copy_run_keeps_the_last_epochs_and_averages_them(tmp_path):
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=4", "data.copy_batches=5",
                               "train.keep_last_epochs=2", "train.average_last=2", "train.progress=false",
                               "train.device=cpu"])
    train_worker(cfg)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["last.pt"]
    assert sorted(p.stem for p in tmp_path.glob("*.safetensors")) == ["avg", "best", "epoch_03", "epoch_04"]
    assert not list(tmp_path.glob("*.json"))  # each model file is one .safetensors, config and vocabulary inside
    a, b, avg = (load_checkpoint(tmp_path / f"{n}.safetensors")["model"] for n in ("epoch_03", "epoch_04", "avg"))
    name = "generator.proj.weight"
    assert not torch.equal(a[name], b[name])  # two different epochs, so the average is no copy of either
    for key, value in avg.items():
        assert torch.allclose(value, (a[key] + b[key]) / 2, atol=1e-6), key


@pytest.mark.slow
def test_translation_run_scores_the_better_of_best_and_average_on_val(tiny_config, tmp_path, capsys):
    # Two quick epochs: training on the 735 pairs of at most 9 ids (longer ones skipped); val and test stay whole.
    cfg = tiny_config(f"train.out_dir={tmp_path}", "train.max_steps=0", "train.epochs=2", "data.max_sentence_len=9",
                      "data.long_policy=skip", "train.keep_last_epochs=2", "train.average_last=2",
                      "train.bleu_every=0", "train.device=cpu", "train.progress=false", "decode.max_len_a=4",
                      "decode.beam_size=2")
    results = train_worker(cfg)
    out = capsys.readouterr().out
    found = re.search(r"val BLEU: best\.safetensors (\S+) \| avg\.safetensors \(last 2 epochs averaged\) (\S+)", out)
    assert found, out[-2000:]
    best_bleu, avg_bleu = float(found.group(1)), float(found.group(2))
    assert results["val_bleu"] == pytest.approx(max(best_bleu, avg_bleu), abs=0.006)
    best_name = f"best.safetensors (epoch {results['best_epoch']})"
    if avg_bleu != best_bleu:
        assert results["final_checkpoint"] == ("avg.safetensors" if avg_bleu > best_bleu else best_name)
    else:  # equal to the two printed decimals: the unrounded scores decided
        assert results["final_checkpoint"] in ("avg.safetensors", best_name)
    assert "test_bleu_beam2" in results
    final = RunDir(tmp_path).records()[-1]
    assert final["kind"] == "final" and final["checkpoint"] == results["final_checkpoint"]
    last = out.strip().splitlines()[-1]  # the last line: the command that translates with the chosen weights
    assert last.startswith("translate with it: ")
    assert last.endswith(f"--checkpoint {tmp_path / final['checkpoint_file']}")
