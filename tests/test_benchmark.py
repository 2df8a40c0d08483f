"""scripts/benchmark.py: the FLOP count behind MFU, the JSON a user gets, and bad input.

Speed itself is never asserted here (speed goals live in the benchmark, not in timed tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from annotated_transformer.lab.hardware import train_step_flops
from annotated_transformer.model import make_model, subsequent_mask

ROOT = Path(__file__).resolve().parents[1]


def forward_flops(model, S: int, T: int) -> int:
    """Matmul FLOPs PyTorch counts for one unpadded sentence pair through encoder, decoder and generator."""
    src = torch.randint(4, 50, (1, S))
    tgt = torch.randint(4, 60, (1, T))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model(src, tgt, torch.ones(1, 1, S, dtype=torch.bool), subsequent_mask(T))
        model.generator(out)
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_train_step_flops_matches_pytorchs_flop_counter(attention):
    N, d, d_ff = 2, 32, 96
    model = make_model(50, 60, N=N, d_model=d, d_ff=d_ff, h=4, dropout=0.0, attention=attention).eval()
    pairs = [(7, 5), (12, 19)]
    counted = sum(forward_flops(model, S, T) for S, T in pairs)
    ours = train_step_flops(d, d_ff, N, 60, [S for S, _ in pairs], [T for _, T in pairs])
    assert ours == 3 * counted  # backward = 2x forward


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/benchmark.py"), *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_benchmark_json_and_sweep_chart(multi30k_dir, data_cache_dir, tmp_path):
    proc = run("--config", "tiny", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
               "train.precision=fp32", "train.device=cpu", "--steps", "2", "--warmup", "1", "--sentences", "40",
               "--one-sentence", "8", "--sweep", "--sweep-tokens", "256", "--sweep-lengths", "8,16",
               "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert isinstance(result["device"], str) and result["device"].strip()  # a machine name
    t, d = result["train"], result["decode"]
    assert t["ratio"] == pytest.approx(t["fast_tokens_per_s"] / t["notebook_tokens_per_s"])
    assert 0 < t["mfu"] < 1 and 0 < t["notebook_mfu"] < 1
    assert t["notebook"]["attention"] == "naive" and t["fast"]["attention"] == "sdpa"
    assert t["notebook"]["loss_finite"] and t["fast"]["loss_finite"]
    # the notebook side really is the notebook's batching: 32 sentences, so a few hundred target tokens
    assert t["notebook"]["tokens_per_step"] < 32 * 40
    for key in ("one_sentence_per_s", "batched_greedy_per_s", "beam5_per_s"):
        assert d[key] > 0
    assert d["ratio"] == pytest.approx(d["batched_greedy_per_s"] / d["one_sentence_per_s"])
    assert d["sentences"] == 40 and d["one_sentence_sentences"] == 8
    # in fp32 the notebook's decoder and the batched cached one pick the same tokens
    assert d["one_sentence_agreement"] >= 0.875
    assert [(r["batch_tokens"], r["sentence_length"]) for r in result["sweep"]] == [(256, 8), (256, 16)]
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "benchmark.json").read_text())["train"] == t


@pytest.mark.parametrize("args, needle", [
    (["--config", "tiny", "--steps", "0"], "--steps must be at least 1"),
    (["--config", "copy"], "needs a Multi30k config"),
    (["--config", "tiny", "train.precison=bf16"], "did you mean 'train.precision'"),
])
@pytest.mark.slow
def test_benchmark_bad_input_is_one_clear_line(args, needle):
    proc = run(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_matmul_peak_is_the_best_of_its_timed_runs(monkeypatch):
    from annotated_transformer.lab import hardware

    durations = iter([9.0, 9.0] + [1.0, 0.25, 2.0] + [1.0] * 17)  # two untimed, then 20 timed
    clock = {"t": 0.0, "start": True}

    def fake_clock():
        if not clock["start"]:
            clock["t"] += next(durations)
        clock["start"] = not clock["start"]
        return clock["t"]

    monkeypatch.setattr(hardware.time, "perf_counter", fake_clock)
    peak = hardware.matmul_peak(torch.device("cpu"), torch.float32, n=8, repeats=20)
    assert peak == pytest.approx(2 * 8**3 / 0.25)  # the fastest run, not the median (1.0) nor the first ones
