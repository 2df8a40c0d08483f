"""The copy task end to end through the user's command."""

import json
from pathlib import Path

import pytest
import torch

from annotated_transformer import data_gen
from annotated_transformer.cli import run
from annotated_transformer.checkpoints import load_checkpoint


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


def train_copy_yaml(capsys, out: Path) -> tuple[int, str, str]:
    """`train --config copy.yaml train.out_dir=OUT`, as scripts/train.py runs it, in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run("train", ["--config", "copy.yaml", f"train.out_dir={out}"], "train.py")
    stdout, stderr = capsys.readouterr()
    return done.value.code, stdout, stderr


@pytest.mark.slow
def test_copy_yaml_trains_to_perfect_copies(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, stderr = train_copy_yaml(capsys, out)
    assert code == 0, stderr[-2000:]
    assert "exact copies: 100/100" in stdout, stdout[-2000:]
    # the run directory holds the resolved config, metrics and checkpoints
    assert (out / "config.yaml").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 20
    final = records[-1]  # the run's end, which a sweep counts as finished
    assert final["kind"] == "final" and final["exact_copies"] == 100 and final["step"] == 400
    # What the user sees is the exact copies above. The val loss falls from its first epoch, but how far it is at
    # the 20th depends on the CPU: late spikes come and go with the GEMM's rounding (0.001 on an Intel AMX CPU,
    # 0.35 on an AMD Zen 5), and best.pt (lowest val loss) is what makes the copies.
    losses = [e["val_loss"] for e in epochs]
    assert min(losses[1:]) < losses[0]
    assert load_checkpoint(out / "best.safetensors")["train_state"]["epoch"] == 1 + losses.index(min(losses))
    for name in ("best.safetensors", "last.pt", "epoch_01.safetensors", "epoch_20.safetensors"):
        assert (out / name).is_file(), name
    # and the run's charts, drawn at its end
    assert "vegaEmbed(" in (out / "charts" / "training_curves.html").read_text(encoding="utf-8")
    assert (out / "charts" / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    last = load_checkpoint(out / "last.pt")
    assert last["train_state"]["step"] == 400 and last["train_state"]["epoch"] == 20
    # the same command again finds the run finished and leaves it as it is
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, stdout, _ = train_copy_yaml(capsys, out)
    assert code == 0 and "holds a finished run (20 epochs complete, 400 steps)" in stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_the_copy_loader_resumes_mid_epoch_and_at_its_end_with_the_batches_it_served_counted():
    from annotated_transformer.data.copy_loader import CopyLoader

    def loader() -> CopyLoader:
        return CopyLoader(11, 4, 5, 6, seed=3)

    first = loader()
    batches = list(first)
    assert first.taken == 5 and first.lengths_served(0, 5)[0].tolist() == [6] * 20
    middle, end = loader(), loader()
    middle.load_state_dict({"epoch": 0, "taken": 2})
    rest = list(middle)
    assert [b.src.tolist() for b in rest] == [b.src.tolist() for b in batches[2:]] and middle.taken == 5
    end.load_state_dict(first.state_dict())  # stopped after the last batch: nothing left, nothing uncounted
    assert list(end) == [] and end.taken == 5
