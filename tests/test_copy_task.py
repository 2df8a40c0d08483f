"""The copy task end to end through the user's command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer import data_gen
from annotated_transformer.harness.checkpointing import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_data_gen_follows_the_notebook():
    g = torch.Generator().manual_seed(0)
    batches = list(data_gen(11, 8, 3, generator=g))
    assert len(batches) == 3
    b = batches[0]
    assert b.src.shape == (8, 10)
    assert torch.all(b.src[:, 0] == 1)  # the start symbol
    assert b.src.min() >= 1 and b.src.max() <= 10  # 0 is padding and never generated
    assert torch.equal(b.tgt, b.src[:, :-1]) and torch.equal(b.tgt_y, b.src[:, 1:])
    assert b.ntokens == 8 * 9


@pytest.mark.slow
def test_copy_yaml_trains_to_perfect_copies(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "copy.yaml", f"train.out_dir={out}"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exact copies: 100/100" in proc.stdout, proc.stdout[-2000:]
    # the run directory holds the resolved config, metrics and checkpoints
    assert (out / "config.yaml").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 20
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"] / 10
    for name in ("best.pt", "last.pt", "epoch_01.pt", "epoch_20.pt"):
        assert (out / name).is_file(), name
    last = load_checkpoint(out / "last.pt")
    assert last["train_state"]["step"] == 400 and last["train_state"]["epoch"] == 20
    # the same command again finds the run finished and leaves it as it is
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "copy.yaml", f"train.out_dir={out}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert again.returncode == 0 and "holds a finished run (20 epochs, 400 steps)" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
