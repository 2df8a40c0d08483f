"""scripts/benchmark.py: the FLOP count behind MFU, the JSON a user gets, and bad input.

Speed itself is never asserted here (speed goals live in the benchmark, not in timed tests).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from annotated_transformer.harness import malloc
from annotated_transformer.runtime.model_flops import train_step_flops
from annotated_transformer.fast import FusedAttention, swap_class
from annotated_transformer.model import MultiHeadedAttention, make_model, subsequent_mask


def forward_flops(model, S: int, T: int) -> int:
    """Matmul FLOPs PyTorch counts for one unpadded sentence pair through encoder, decoder and generator."""
    src = torch.randint(4, 50, (1, S))
    tgt = torch.randint(4, 60, (1, T))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model(src, tgt, torch.ones(1, 1, S, dtype=torch.bool), subsequent_mask(T))
        model.generator(out)
    return counter.get_total_flops()


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_train_step_flops_matches_pytorchs_flop_counter(fused):
    cpu_kernel = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if fused and (cpu_kernel is None or cpu_kernel not in flop_registry):
        pytest.skip(f"torch {torch.__version__}'s flop counter does not count the CPU's fused attention kernel "
                    "(torch 2.15 does); the explicit case checks the same formula")
    N, d, d_ff = 2, 32, 96
    model = make_model(50, 60, N=N, d_model=d, d_ff=d_ff, h=4, dropout=0.0).eval()
    if fused:
        swap_class(model, MultiHeadedAttention, FusedAttention)
    pairs = [(7, 5), (12, 19)]
    counted = sum(forward_flops(model, S, T) for S, T in pairs)
    ours = train_step_flops(d, d_ff, N, 60, [S for S, _ in pairs], [T for _, T in pairs])
    assert ours == 3 * counted  # backward = 2x forward


@pytest.mark.slow
def test_benchmark_json_and_sweep_chart(multi30k_dir, data_cache_dir, tmp_path, command, monkeypatch):
    """The benchmark command in this process, each training side measured here too (the fresh process the
    benchmark gives each side is tested below) and the matmul peak on small matrices (tested above)."""
    from annotated_transformer.lab import benchmark, hardware

    monkeypatch.setattr(benchmark, "in_fresh_process", lambda what, fn, *args, preload=None: fn(*args))
    monkeypatch.setattr(benchmark, "matmul_peak",
                        lambda device, dtype, n=None, repeats=20: hardware.matmul_peak(device, dtype, 512, 3))
    code, stdout, stderr = command(
        "benchmark", "--config", "tiny", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
        "train.precision=fp32", "train.device=cpu", "decode.max_len_a=5", "--steps", "2", "--warmup-steps", "1",
        "--sentences", "40", "--one-sentence", "8", "--sweep", "--sweep-tokens", "256", "--sweep-lengths", "8,16",
        "--out", tmp_path, "--json")
    assert code == 0, stderr.decode()
    result = json.loads(stdout)
    assert isinstance(result["device"], str) and result["device"].strip()  # a machine name
    t, d = result["train"], result["decode"]
    assert t["ratio"] == pytest.approx(t["fast_tokens_per_s"] / t["notebook_tokens_per_s"])
    assert 0 < t["mfu"] < 1 and 0 < t["notebook_mfu"] < 1
    assert t["notebook"]["attention"] == "explicit" and t["fast"]["attention"] == "auto"
    assert t["notebook"]["loss_finite"] and t["fast"]["loss_finite"]
    assert t["notebook"]["steps"] == t["fast"]["steps"] == 2
    assert t["fast"]["warmup_s"] > 0  # the untimed step, timed apart
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


def child_facts(x: int) -> dict:
    """What in_fresh_process's child reports: its process id and its argument (a ValueError for x < 0)."""
    import os

    if x < 0:
        raise ValueError(f"x is {x}")
    return {"pid": os.getpid(), "x": x}


@pytest.mark.slow
def test_in_fresh_process_runs_the_function_in_another_process_and_names_a_failure():
    import os

    from annotated_transformer.lab.hardware import in_fresh_process

    facts = in_fresh_process("facts", child_facts, 7)
    assert facts["x"] == 7 and facts["pid"] != os.getpid()
    with pytest.raises(RuntimeError, match=r"^facts failed: ValueError: x is -1$"):
        in_fresh_process("facts", child_facts, -1)


@pytest.mark.parametrize("args, needle", [
    (["--config", "tiny", "--steps", "0"], "--steps must be at least 1"),
    (["--config", "copy"], "needs a Multi30k config"),
    (["--config", "tiny", "train.precison=bf16"], "did you mean 'train.precision'"),
    (["--config", "tiny", "--one-sentence", "0"], "--one-sentence must be at least 1, got 0"),  # ZeroDivisionError
    (["--config", "tiny", "--limit", "0"], "--limit must be at least 1, got 0"),  # it decoded every sentence
    (["--config", "tiny", "--skip-train", "--skip-decode"], "leaves nothing to measure"),
    (["--config", "tiny", "--pairs", "10"], "--pairs sizes the synthetic corpus of --scale"),  # ignored before
    (["--config", "tiny", "--pairs", "4500000"], "--pairs sizes the synthetic corpus of --scale"),  # the default too
    (["--config", "tiny", "--profile", "--engines"], "--engines and --profile are different tables"),
])
def test_benchmark_bad_input_is_one_clear_line(args, needle, command):
    code, stdout, stderr = command("benchmark", *args)
    assert code == 2
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert stdout == b""


@pytest.mark.parametrize("table, name", [([], "benchmark.json"), (["--engines"], "engines.json"),
                                         (["--gpu"], "gpu_check.json"), (["--products"], "products.json")])
def test_an_earlier_benchmark_file_is_refused_before_anything_is_measured(tmp_path, command, table, name):
    earlier = tmp_path / name
    earlier.write_text("{}\n")
    code, stdout, stderr = command("benchmark", "--config", "tiny", *table, "--out", tmp_path)
    assert code == 2 and stdout == b""
    assert stderr.decode().splitlines() == [f"error: {earlier} already exists (a file); choose another --out, or "
                                            "pass --overwrite to replace it"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and earlier.read_text() == "{}\n"


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


@pytest.mark.slow
def test_speed_report_takes_medians_of_interleaved_rounds(multi30k_dir, data_cache_dir, tmp_path, command,
                                                          monkeypatch):
    """benchmark --all: each round trains eager then compiled, then decodes; the table holds per-side medians."""
    from annotated_transformer.lab import benchmark, engine_benchmark

    calls = []

    def fake_training(side, cfg, steps, warmup, preload=None):
        calls.append("compiled" if cfg.train.compile else "eager")
        n = sum(c == calls[-1] for c in calls)  # this side's round: 1, 2, 3
        rate = {"eager": [100.0, 300.0, 200.0], "compiled": [150.0, 90.0, 120.0]}[calls[-1]][n - 1]
        return {"tokens_per_s": rate, "step_ms": 1000 / rate, "mfu": rate / 1000, "peak_flop_per_s": 1e12,
                "warmup_s": 2.0 if cfg.train.compile else 0.1, "peak_mem_gb": 1.0, "precision": "fp32",
                "malloc": "system" if preload is None else preload.name}

    def fake_engines(checkpoint, limit=None, data_root=None, log=print):
        calls.append("engines")
        r = calls.count("engines")
        rows = [{"engine": "torch-fp32", "greedy_per_s": [10.0, 30.0, 20.0][r - 1], "beam5_per_s": 5.0,
                 "latency_ms": 8.0, "peak_mem_gb": 1.0, "bleu": 20.0, "same_as_torch_fp32": 1.0},
                {"engine": "ct2-float32", "greedy_per_s": 40.0, "beam5_per_s": [9.0, 10.0, 11.0][r - 1],
                 "latency_ms": 2.0, "peak_mem_gb": 0.5, "bleu": 20.1, "same_as_torch_fp32": 0.99}]
        return {"checkpoint": checkpoint, "sentences": 8, "beam": 5, "threads": 2, "rows": rows}

    monkeypatch.setattr(benchmark, "measure_in_subprocess", fake_training)
    monkeypatch.setattr(engine_benchmark, "compare_engines", fake_engines)
    monkeypatch.delenv(malloc.RESTARTED_ENV, raising=False)  # the suite's "system": this test's library is wanted
    library = tmp_path / "libpretend.so"  # train.malloc names it: the training sides get it, never loaded here
    library.write_bytes(b"")
    code, stdout, stderr = command(
        "benchmark", "--config", "tiny", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
        "train.precision=fp32", "train.device=cpu", f"train.malloc={library}", "--all", "--checkpoint",
        tmp_path / "best.pt", "--rounds", "3", "--out", tmp_path, "--json")
    assert code == 0, stderr.decode()
    assert calls == ["eager", "compiled", "engines"] * 3  # interleaved
    result = json.loads(stdout)
    t = result["train"]
    assert (t["eager"]["tokens_per_s"], t["compiled"]["tokens_per_s"]) == (200.0, 120.0)
    assert t["eager"]["tokens_per_s_all"] == [100.0, 300.0, 200.0]
    assert result["compiled_over_eager"] == pytest.approx(0.6)
    assert t["compiled"]["warmup_s"] == 2.0
    ours, ct2 = result["engines"]["rows"]
    assert (ours["greedy_per_s"], ct2["beam5_per_s"]) == (20.0, 10.0)
    assert ct2["greedy_ratio"] == pytest.approx(2.0) and ct2["latency_ratio"] == pytest.approx(4.0)
    assert "AVX512-BF16" in result["machine"] and "threads" in result["machine"]
    assert json.loads((tmp_path / "speed_report.json").read_text()) == result
    from annotated_transformer.lab.speed_report import format_speed_report

    text = format_speed_report(result)
    assert "| eager | 200 |" in text and "| compiled | 120 |" in text and "compiled / eager: 0.60x" in text
    assert "| ct2-float32 | 40.0 (2.00x) |" in text
    assert "training under malloc libpretend.so" in text.splitlines()[0]


@pytest.mark.parametrize("args, needle", [
    (["--all"], "--all compares decoders on trained weights"),
    (["--all", "--checkpoint", "x.pt", "--rounds", "0"], "--rounds must be at least 1"),
])
def test_speed_report_bad_input_is_one_clear_line(args, needle, command):
    code, stdout, stderr = command("benchmark", "--config", "tiny", *args)
    assert code == 2
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines


def test_engines_rounds_take_medians(tmp_path, command, monkeypatch):
    """benchmark --engines --rounds N: every engine measured N times; the table holds the medians."""
    from annotated_transformer.lab import engine_benchmark

    rounds = []

    def fake_engines(checkpoint, limit=None, data_root=None, log=print):
        rounds.append(checkpoint)
        r = len(rounds)
        rows = [{"engine": "torch-fp32", "greedy_per_s": [10.0, 30.0, 20.0][r - 1], "beam5_per_s": 5.0,
                 "latency_ms": [8.0, 4.0, 6.0][r - 1], "peak_mem_gb": 1.0, "bleu": 20.0, "same_as_torch_fp32": 1.0},
                {"engine": "ct2-float32", "greedy_per_s": 40.0, "beam5_per_s": [9.0, 11.0, 10.0][r - 1],
                 "latency_ms": 2.0, "peak_mem_gb": 0.5, "bleu": 20.1, "same_as_torch_fp32": 0.99}]
        return {"checkpoint": checkpoint, "sentences": 8, "beam": 5, "threads": 2, "rows": rows}

    monkeypatch.setattr(engine_benchmark, "compare_engines", fake_engines)
    (tmp_path / "best.pt").write_bytes(b"")
    code, stdout, stderr = command("benchmark", "--config", "tiny", "--engines", "--checkpoint", tmp_path / "best.pt",
                                   "--rounds", "3", "--json")
    assert code == 0, stderr.decode()
    assert len(rounds) == 3 and json.loads(stdout)["rounds"] == 3
    ours, ct2 = json.loads(stdout)["rows"]
    assert (ours["greedy_per_s"], ours["latency_ms"], ct2["beam5_per_s"]) == (20.0, 6.0, 10.0)
    assert ours["greedy_per_s_all"] == [10.0, 30.0, 20.0]
    assert ct2["greedy_ratio"] == pytest.approx(2.0) and ct2["latency_ratio"] == pytest.approx(3.0)


class _RecordProducts(TorchDispatchMode):
    """Records the shapes and strides of the operands of every matrix product run inside it."""

    def __init__(self):
        super().__init__()
        self.operands = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.operands.append(tuple((tuple(a.shape), a.stride()) for a in args[:2]))
        return func(*args, **(kwargs or {}))


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_products_are_the_ones_a_training_step_computes_for_every_linear_layer_of_the_model():
    """benchmark --products times the model's own layer shapes, and autograd's products in autograd's layouts."""
    from torch import nn

    from annotated_transformer.config import load_config
    from annotated_transformer.lab.product_benchmark import (FORWARD, INPUT_GRAD, PRODUCTS, WEIGHT_GRAD,
                                                             linear_shapes)

    cfg = load_config("cpu_15min.yaml", ["model.N=1"])  # a SentencePiece config: the generator's size is known
    m = cfg.model
    model = make_model(cfg.data.spm_vocab_size, cfg.data.spm_vocab_size, N=m.N, d_model=m.d_model, d_ff=m.d_ff,
                       h=m.h, tie_embeddings=m.tie_embeddings)
    in_model = {(layer.in_features, layer.out_features) for layer in model.modules() if isinstance(layer, nn.Linear)}
    assert set(linear_shapes(cfg).values()) == in_model
    notes = []
    assert "generator" not in linear_shapes(load_config("tiny.yaml", []), notes.append)  # word vocabulary: data
    assert len(notes) == 1 and "generator is left out" in notes[0]

    torch.manual_seed(0)
    x = torch.randn(6, 5, requires_grad=True)  # (M, k)
    w = torch.randn(3, 5, requires_grad=True)  # (n, k)
    dy = torch.randn(6, 3)  # (M, n)
    with _RecordProducts() as autograd_products:
        y = nn.functional.linear(x, w)
        y.backward(dy)
    with _RecordProducts() as ours, torch.no_grad():
        values = {name: PRODUCTS[name](x, w, dy) for name in (FORWARD, INPUT_GRAD, WEIGHT_GRAD)}
    assert sorted(ours.operands) == sorted(autograd_products.operands)  # the same products, operands laid out alike
    assert ((3, 6), (1, 3)) in [a for pair in ours.operands for a in pair]  # dY^T as a transposed view
    torch.testing.assert_close(values[FORWARD], y)
    torch.testing.assert_close(values[INPUT_GRAD], x.grad)
    torch.testing.assert_close(values[WEIGHT_GRAD], w.grad)
    for name, product in PRODUCTS.items():  # the variants in other layouts compute the same weight gradient
        if name not in values:
            got = product(x.detach(), w.detach(), dy)
            torch.testing.assert_close(got, w.grad)
            assert got.is_contiguous()  # in W's layout, as a gradient is accumulated


def test_the_products_table_reports_every_product_against_the_peak(command, monkeypatch):
    from annotated_transformer.lab import product_benchmark

    monkeypatch.setattr(product_benchmark, "matmul_peak", lambda device, dtype: 4e9)  # 4 GFLOP/s, to check the shares
    args = ["--config", "cpu_15min.yaml", "--products", "--steps", "1", "--warmup-steps", "0", "model.d_model=32",
            "model.d_ff=64", "data.batch_tokens=16", "data.spm_vocab_size=50", "train.device=cpu"]
    code, stdout, stderr = command("benchmark", *args, "--json")
    assert code == 0, stderr.decode()
    result = json.loads(stdout)
    assert result["rows"] == 16 and result["peak_gflops"] == pytest.approx(4.0) and result["warmup"] == 0
    layers = {(r["layer"], r["in"], r["out"]) for r in result["table"]}
    assert layers == {("attention projection", 32, 32), ("feed-forward w_1", 32, 64), ("feed-forward w_2", 64, 32),
                      ("generator", 32, 50)}
    for r in result["table"]:
        flops = 0 if r["product"] == product_benchmark.COPY else 2 * 16 * r["in"] * r["out"]
        assert r["ms"] > 0 and r["gflops"] == pytest.approx(flops / (r["ms"] / 1e3) / 1e9)
        assert r["of_peak"] == pytest.approx(r["gflops"] / 4.0)
    assert len(result["table"]) == 4 * 6  # five products and the copy, for each kind of layer
    assert "products of cpu_15min" in stderr.decode()  # progress goes to stderr with --json

    code, stdout, _ = command("benchmark", *args)
    rows = [line for line in stdout.decode().splitlines() if line.startswith("| ") and not line.startswith("| layer")
            and " -> " in line]
    assert code == 0 and len(rows) == 4 * 6
    assert all(row.count("|") == 6 for row in rows)  # five cells, the copy's rate cells empty
    assert sum(row.endswith("|  |  |") for row in rows) == 4  # one copy row per layer


def test_products_with_no_timed_calls_is_one_clear_line(command):
    code, stdout, stderr = command("benchmark", "--config", "cpu_15min.yaml", "--products", "--steps", "0")
    lines = stderr.decode().strip().splitlines()
    assert code == 2 and stdout == b"" and len(lines) == 1
    assert lines[0].startswith("error: --steps must be at least 1") and "--products" in lines[0]
