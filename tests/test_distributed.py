"""torchrun with 2 CPU processes (gloo) matches one process with the same global batch; on a GPU, torchrun runs
train.compile=captured's step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.checkpoints import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _meter_rank(rank: int, init_file: str, out: str) -> None:
    """One of two gloo ranks: a meter stopped mid-epoch, saved (a collective), loaded by a fresh one, read."""
    import torch.distributed as dist
    from annotated_transformer.harness.loss_meter import LossMeter

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        stopped = LossMeter()
        stopped.add(torch.tensor([10.0, 40.0][rank]), tokens=100)  # each rank's own batches before the stop
        saved = stopped.state_dict()
        resumed = LossMeter()
        resumed.load_state_dict(saved)
        resumed.add(torch.tensor(3.0), tokens=30)  # after the resume, on each rank
        epoch = resumed.read_epoch()
        if rank == 0:
            Path(out).write_text(json.dumps({"saved": saved, "epoch": epoch}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes, each importing torch
def test_a_resumed_epoch_loss_counts_every_ranks_steps_before_the_stop(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "meter.json"
    mp.spawn(_meter_rank, args=(str(tmp_path / "init"), str(out)), nprocs=2)
    result = json.loads(out.read_text())
    assert result["saved"]["epoch_loss"] == 50.0 and result["saved"]["epoch_tokens"] == 200
    assert result["saved"]["ranks"] == 2
    assert result["epoch"] == pytest.approx((10 + 40 + 3 + 3) / (100 + 100 + 30 + 30))  # not rank 0's sums twice


def train_losses(run_dir: Path) -> tuple[list[float], float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if r["kind"] == "train"]
    val = [r["val_loss"] for r in records if r["kind"] == "epoch"][-1]
    return train, val


@pytest.mark.slow
def test_torchrun_two_ranks_matches_one_process_with_accumulation(tmp_path, tiny_config, multi30k_dir, data_cache_dir):
    from annotated_transformer.harness.trainer import train_worker

    common = [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}", "train.max_steps=20",
              "train.log_every=5", "model.dropout=0.0", "train.final_eval=false", "train.progress=false",
              "train.device=cpu", "train.precision=fp32"]  # bf16's rounding is larger than the tolerance below
    # One process, in this one: two micro-batches a step (this also builds the data cache the ranks then read).
    train_worker(tiny_config(*common, "train.accum_steps=2", f"train.out_dir={tmp_path / 'single'}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "scripts/train.py",
         "--config", "tiny", *common, f"train.out_dir={tmp_path / 'ddp'}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "x 2 ranks" in ddp.stdout
    assert ddp.stdout.count("step     20") == 1  # only rank 0 logs

    single_loss, single_val = train_losses(tmp_path / "single")
    ddp_loss, ddp_val = train_losses(tmp_path / "ddp")
    assert len(single_loss) == len(ddp_loss) == 4
    # Same global batches and the same token normalisation: only float summation order differs.
    for a, b in zip(single_loss, ddp_loss):
        assert b == pytest.approx(a, rel=2e-3)
    assert ddp_val == pytest.approx(single_val, rel=2e-3)
    assert single_loss[-1] < single_loss[0]  # and it did learn something
    # rank 0 alone wrote the run directory
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir() if p.suffix in (".pt", ".safetensors", ".json")) == [
        "best.safetensors", "last.pt"]
    # Each rank draws its own dropout masks (rank 1 is seeded apart after the model is built).
    rng = load_checkpoint(tmp_path / "ddp" / "last.pt")["rng"]
    assert not torch.equal(rng["0"]["torch"], rng["1"]["torch"])


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (CPU ranks: above)")
def test_torchrun_one_gpu_rank_trains_captured_as_one_eager_process(tmp_path, tiny_config, multi30k_dir,
                                                                   data_cache_dir):
    from annotated_transformer.harness.trainer import train_worker

    common = [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}", "train.max_steps=20",
              "train.log_every=5", "model.dropout=0.0", "train.final_eval=false", "train.progress=false",
              "train.device=cuda", "train.precision=bf16"]
    train_worker(tiny_config(*common, "train.compile=false", f"train.out_dir={tmp_path / 'eager'}"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "scripts/train.py",
         "--config", "tiny", *common, "train.compile=captured", f"train.out_dir={tmp_path / 'captured'}"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    eager_loss, eager_val = train_losses(tmp_path / "eager")
    captured_loss, captured_val = train_losses(tmp_path / "captured")
    assert len(captured_loss) == len(eager_loss) == 4
    for a, b in zip(eager_loss, captured_loss):  # the same batches: bf16 rounding apart
        assert b == pytest.approx(a, rel=5e-2)
    assert captured_val == pytest.approx(eager_val, rel=5e-2)
