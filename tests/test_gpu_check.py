"""`benchmark --gpu`: the one-call GPU check, on the CPU (the same parts; CUDA graphs aside)."""

from __future__ import annotations

import json

import pytest
import torch

from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.lab import gpu_check as check


def test_without_a_gpu_the_check_says_so_in_one_line(command, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, stdout, stderr = command("benchmark", "--config", "tiny", "--gpu")
    lines = stderr.decode().strip().splitlines()
    assert code == 2 and len(lines) == 1 and stdout == b""
    assert "found no CUDA GPU" in lines[0] and "--device cpu" in lines[0]


def test_the_script_keeps_an_earlier_checks_log(tmp_path):
    """scripts/gpu_check.sh run into a folder that holds a check: refused before its tee empties the log."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
    out = tmp_path / "gpu_check"
    out.mkdir()
    (out / "gpu_check.log").write_text("the first check's figures\n")
    done = subprocess.run(["bash", str(script), "run"], env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and "--overwrite" in done.stderr and done.stderr.count("\n") == 1
    assert (out / "gpu_check.log").read_text() == "the first check's figures\n"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log"]
    done = subprocess.run(["bash", str(script), "run", "--out", str(tmp_path / "x")],  # its folder is $OUT's
                          env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "set OUT instead of passing --out" in done.stderr


def test_modes_are_checked_before_anything_runs():
    cpu = torch.device("cpu")
    assert check.check_modes(["compiled", "eager"], cpu) == ["eager", "compiled"]  # MODES' order
    with pytest.raises(ConfigError, match="unknown mode 'graph'; choose from eager, compiled, captured, graphed"):
        check.check_modes(["graph"], cpu)
    for mode in ("captured", "graphed"):
        with pytest.raises(ConfigError, match=f"{mode} needs a CUDA GPU"):
            check.check_modes([mode, "eager"], cpu)


def test_the_run_summary_estimates_the_whole_run_from_its_epochs(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    records = [{"kind": "start", "step": 0}]
    for epoch, (wall, bleu) in enumerate([(14.0, None), (24.0, 3.5), (34.0, 7.25)], start=1):
        records.append({"kind": "epoch", "epoch": epoch, "seconds": 8.0 + epoch, "eval_seconds": 1.5,
                        "wall_seconds": wall, "bleu": bleu})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines: list[str] = []
    got = check.summarize_run(out, -2, 40.0, 40, tmp_path / "run.log", lines.append)
    assert got["epochs_done"] == 3 and got["epochs_total"] == 40
    assert got["wall_seconds_per_epoch"] == 10.0  # the first epoch's start-up left out
    assert got["estimate_whole_run_s"] == 14.0 + 39 * 10.0
    assert got["step_seconds_per_epoch"] == 10.0 and got["eval_seconds_per_epoch"] == 1.5
    assert got["val_bleu"] == 7.25 and "3 of 40 epochs" in lines[0]
    (out / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")  # stopped before its first epoch
    assert check.summarize_run(out, -2, 5.0, 40, tmp_path / "run.log", lines.append)["epochs_done"] == 0
    assert "no epoch finished in 5 s" in lines[-1]


@pytest.mark.slow
def test_the_check_times_each_mode_and_size_and_trains_through_the_users_command(
        tiny_config, multi30k_dir, data_cache_dir, tmp_path, command, monkeypatch):
    monkeypatch.setattr(check, "LARGE_BATCH_TOKENS", 1024)  # the CPU's stand-in for 16k tokens
    monkeypatch.setattr(check, "DISTINCT_BATCHES", 2)
    monkeypatch.setattr(check, "DECODE_SENTENCES", 128)  # one batch a pass: the GPU's figure is of 512
    # Short sentences and big batches: an epoch of a few steps, so the run ends on its own well inside its time.
    short = ["data.max_sentence_len=8", "data.long_policy=skip", "train.max_steps=0", "train.epochs=2",
             "train.bleu_every=1", "decode.max_len_a=5", "train.final_eval=false"]
    overrides = [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}", "train.precision=fp32", *short]
    code, stdout, stderr = command("benchmark", "--config", "tiny", "--gpu", "--device", "cpu", "--modes", "eager",
                                   "--steps", "4", "--warmup", "1", "--train-seconds", "600", "--out", tmp_path,
                                   *overrides)
    assert code == 0, stderr.decode()[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["precision"] == "fp32" and result["peak_flop_per_s"] > 0
    assert set(result["steps"]) == {"512", "1024"}  # tiny.yaml's batch size and the large one
    for size in ("512", "1024"):
        row = result["steps"][size]["eager"]
        assert row["steps"] == 4 and row["loss_finite"] and row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
        assert row["gpu_busy"] is None  # a GPU's figure only
    decode = result["decode"]  # --modes eager: greedy search on the shapes it meets, and on fixed shapes
    assert list(decode) == ["dynamic", "static"] and all(r["sentences_per_s"] > 0 for r in decode.values())
    assert decode["static"]["same_tokens"] and "| static |" in stdout.decode()
    train = result["train"]
    assert train["exit_code"] == 0 and train["epochs_done"] == train["epochs_total"] == 2
    assert train["estimate_whole_run_s"] > 0 and train["val_bleu"] is not None
    assert (tmp_path / "gpu_check_run" / "last.pt").is_file()
    table = stdout.decode()
    assert "| 1024 | eager |" in table and "training: 2 of 2 epochs" in table
