"""Deploying a trained model (docs/deployment.md). Export to CTranslate2: the engine
computes what our model computes (pre- and post-norm, tied and separate embeddings, a decoder shallower
than the encoder), the scripts work on a trained checkpoint, every mistake is one line with nothing on
disk lost. Our own decoder with dynamic int8 linear layers (--quantize int8)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.config import Config, ModelConfig
from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import ExportError
from annotated_transformer.masks import subsequent_mask
from annotated_transformer.model import make_model

ct2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is in the dev group: uv sync installs it")

from annotated_transformer.deploy.ct2_export import build_spec, check_exportable, import_ctranslate2  # noqa: E402

SENTENCES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee auf einer großen Wiese.", "Kinder spielen."]


def random_model(norm_first: bool, tie: bool, vocab: int = 40):
    """A small model whose every parameter (LayerNorm gains and biases included) is random."""
    cfg = ModelConfig(N=2, N_dec=1, d_model=32, d_ff=48, h=4, dropout=0.0, norm_first=norm_first,
                      tie_embeddings=tie, max_positions=64)
    torch.manual_seed(0)
    model = make_model(vocab, vocab if tie else vocab + 7, N=cfg.N, d_model=cfg.d_model, d_ff=cfg.d_ff, h=cfg.h,
                       dropout=0.0, norm_first=norm_first, tie_embeddings=tie, max_positions=cfg.max_positions,
                       N_dec=cfg.N_dec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval(), cfg


def vocab_tokens(n: int, prefix: str) -> list[str]:
    return ["<s>", "</s>", "<blank>", "<unk>", *(f"{prefix}{i}" for i in range(4, n))]


def load_engine(model, cfg, tmp_path: Path):
    src_itos = vocab_tokens(model.src_embed[0].lut.num_embeddings, "s")
    tgt_itos = src_itos if cfg.tie_embeddings else vocab_tokens(model.tgt_embed[0].lut.num_embeddings, "t")
    spec = build_spec(model, Config(model=cfg), src_itos, tgt_itos)
    spec.validate()
    spec.optimize(quantization="float32")
    spec.save(str(tmp_path))
    return ct2.Translator(str(tmp_path), device="cpu", intra_threads=1), src_itos, tgt_itos


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "separate"])
def test_engine_log_probs_equal_ours(tmp_path, norm_first, tie):
    model, cfg = random_model(norm_first, tie)
    engine, src_itos, tgt_itos = load_engine(model, cfg, tmp_path)
    g = torch.Generator().manual_seed(1)
    src_ids = [torch.randint(4, len(src_itos), (n,), generator=g).tolist() for n in (3, 9, 14)]
    tgt_ids = [torch.randint(4, len(tgt_itos), (n,), generator=g).tolist() for n in (5, 2, 11)]
    scored = engine.score_batch([[src_itos[i] for i in s] for s in src_ids],
                                [[tgt_itos[i] for i in t] for t in tgt_ids])
    for s, t, result in zip(src_ids, tgt_ids, scored):
        src = torch.tensor([[0, *s, 1]])
        tgt_in, tgt_out = torch.tensor([[0, *t]]), [*t, 1]  # <s> y -> y </s>
        with torch.no_grad():
            out = model(src, tgt_in, torch.ones(1, 1, src.size(1), dtype=torch.bool), subsequent_mask(tgt_in.size(1)))
            ours = model.generator(out)[0, torch.arange(len(tgt_out)), tgt_out]  # (T,)
        assert result.tokens == [tgt_itos[i] for i in t] + ["</s>"]
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
def test_engine_greedy_equals_our_greedy(tmp_path, norm_first):
    from annotated_transformer.decode.incremental import greedy_search
    from annotated_transformer.decode.inference import strip_special

    model, cfg = random_model(norm_first, tie=False)
    engine, src_itos, tgt_itos = load_engine(model, cfg, tmp_path)
    g = torch.Generator().manual_seed(2)
    for n in (2, 6, 13):
        s = torch.randint(4, len(src_itos), (n,), generator=g).tolist()
        src = torch.tensor([[0, *s, 1]])
        ours = greedy_search(model, src, torch.ones(1, 1, n + 2, dtype=torch.bool), 12, 0, 1)
        theirs = engine.translate_batch([[src_itos[i] for i in s]], beam_size=1, max_decoding_length=11,
                                        min_decoding_length=0)[0].hypotheses[0]
        assert theirs == [tgt_itos[i] for i in strip_special(ours[0].tolist(), 0, 1)]


@pytest.mark.parametrize("beam", [1, 4])
def test_the_engine_cuts_each_sentence_of_a_batch_at_its_own_limit(tmp_path, beam):
    """Sources of different lengths in one call: each is cut at its own length + decode.max_len_a, as ours are (the
    engine takes one limit a call; a random model rarely ends a sentence, so every cut shows)."""
    from types import SimpleNamespace

    from annotated_transformer.decode.inference import translate_ids
    from annotated_transformer.deploy.ct2_translator import CT2Translator

    model, cfg = random_model(norm_first=True, tie=False)
    engine, src_itos, tgt_itos = load_engine(model, cfg, tmp_path)
    g = torch.Generator().manual_seed(3)
    sources = [[0, *torch.randint(4, len(src_itos), (n,), generator=g).tolist(), 1] for n in (2, 13, 5, 13, 30)]
    ours = translate_ids(model, sources, pad=2, bos=0, eos=1, device=torch.device("cpu"), max_len_a=4,
                         batch_size=8, beam_size=beam, alpha=0.6)
    text = SimpleNamespace(src_vocab=SimpleNamespace(itos=src_itos),
                           tgt_vocab=SimpleNamespace(lookup_indices=lambda toks: [tgt_itos.index(t) for t in toks]))
    config = Config(model=cfg, decode=dataclasses.replace(Config().decode, max_len_a=4))
    translator = CT2Translator(engine, text, config, tmp_path)
    theirs = translator.translate_ids(sources, beam_size=beam, alpha=0.6, batch_size=8)
    assert theirs == ours
    assert len({len(t) for t in theirs}) > 1  # cut at several lengths in the one call
    # With scores: each sentence's hypotheses and scores are those of a search within its own limit.
    found = translator.n_best_ids(sources, beam_size=beam, alpha=0.6, batch_size=8, n_best=beam)
    for ids, hyps in zip(sources, found):
        alone = engine.translate_batch([[src_itos[i] for i in ids[1:-1]]], beam_size=beam, length_penalty=0.6,
                                       max_decoding_length=len(ids) + 4 - 1, num_hypotheses=beam, return_scores=True)[0]
        assert [h for h, _ in hyps] == [text.tgt_vocab.lookup_indices(h) for h in alone.hypotheses]
        assert [score for _, score in hyps] == pytest.approx(alone.scores, abs=1e-3)  # batched, or decoded alone


def test_a_switch_without_an_equivalent_is_refused():
    with_switch = dataclasses.make_dataclass("WithSwitch", [("new_switch", int, dataclasses.field(default=0))],
                                             bases=(ModelConfig,))
    cfg = Config(model=with_switch(N=1))
    check_exportable(cfg)  # left at its default: nothing to convert
    for rate in ("attention_dropout", "activation_dropout"):  # training only: the exported model is the same
        check_exportable(Config(model=dataclasses.replace(ModelConfig(), **{rate: 0.0})))
    cfg.model.new_switch = 4
    with pytest.raises(ExportError, match=r"^model.new_switch=4 has no CTranslate2 equivalent"):
        check_exportable(cfg)
    for key, value in (("local_attention.window", 4), ("token_merging.merge_ratio", 0.25),
                       ("token_merging.prune_ratio", 0.25)):
        with pytest.raises(ExportError, match=rf"^{key}={value} has no CTranslate2 equivalent"):
            check_exportable(load_config("tiny", [f"{key}={value}"]))
    # training only
    check_exportable(load_config("tiny", ["scheduled_sampling.rate=0.3", "guided_attention.weight=0.5"]))


def test_missing_ctranslate2_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import now raises ImportError
    with pytest.raises(ExportError, match=r"uv sync --extra ctranslate2"):
        import_ctranslate2()


def test_ctrl_c_while_ctranslate2_loads_is_an_interrupt_not_a_missing_package(monkeypatch, ctrl_c_during_import):
    """pybind11 turns an exception in a module's start-up into ImportError: a Ctrl-C while ctranslate2 loaded was
    "ctranslate2 is not installed"; it waits for the import's end and is a Ctrl-C (exit 130 in a command)."""
    import importlib
    import signal

    real = importlib.import_module("ctranslate2")

    def met():
        raise ImportError("initialization failed")  # what pybind11 makes of the KeyboardInterrupt

    monkeypatch.delitem(sys.modules, "ctranslate2", raising=False)
    ctrl_c_during_import("ctranslate2", met, lambda: real)
    with pytest.raises(KeyboardInterrupt):
        import_ctranslate2()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------- the commands, on a trained checkpoint
# (in this process, through annotated_transformer.cli: what the scripts run)


@pytest.fixture(scope="module")
def exported(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, command) -> Path:
    out = tmp_path_factory.mktemp("export") / "tiny_ct2"
    code, stdout, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out)
    assert code == 0, stderr.decode()
    assert f"-> {out} (CTranslate2, float32" in stdout.decode()
    return out


def test_translate_gives_our_outputs(tiny_checkpoint, exported, command):
    stdin = "\n".join(SENTENCES).encode()
    ours = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", stdin=stdin)
    theirs = command("translate", "--checkpoint", exported, stdin=stdin)  # the engine follows the folder
    assert ours[0] == 0 and theirs[0] == 0, theirs[2].decode()
    lines = theirs[1].decode().split("\n")[:-1]
    assert len(lines) == len(SENTENCES) and lines[1] == ""  # one line per input, the empty one kept empty
    assert all(lines[i] for i in (0, 2, 3))
    assert theirs[1] == ours[1]


def test_evaluate_scores_the_exported_model(tiny_checkpoint, exported, multi30k_dir, command):
    import json

    args = ("--split", "val", "--limit", "40", "--json", "--data-root", multi30k_dir)
    ours = command("evaluate", "--checkpoint", tiny_checkpoint, "--device", "cpu", *args)
    theirs = command("evaluate", "--engine", "ctranslate2", "--model", exported, *args)  # old spelling
    assert ours[0] == 0 and theirs[0] == 0, theirs[2].decode()
    a, b = json.loads(ours[1]), json.loads(theirs[1])
    assert b["signature"] == a["signature"] and b["bleu"] == pytest.approx(a["bleu"])
    assert b["scores"]["chrf"]["score"] == pytest.approx(a["scores"]["chrf"]["score"])
    assert Path(b["hypotheses"]).parent == exported  # written inside the exported folder


def int8_products_exact() -> bool:
    """Whether this CPU has VNNI for CTranslate2's int8 products (and the tests' MKL is not limited below it)."""
    import os

    from annotated_transformer.runtime.device import cpu_info

    flags = (cpu_info("flags") or "").split()
    limited = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").upper() in ("AVX2", "AVX", "SSE4_2")
    return ("avx512_vnni" in flags or "avx_vnni" in flags) and not limited


def test_int8_export_is_smaller_and_close(tiny_checkpoint, exported, tmp_path, command):
    from annotated_transformer.deploy.ct2_translator import CT2Translator

    out = tmp_path / "int8"
    code, _, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out, "--quantize", "int8")
    assert code == 0, stderr.decode()
    assert (out / "model.bin").stat().st_size < 0.6 * (exported / "model.bin").stat().st_size
    full, small = CT2Translator.from_dir(exported, threads=1), CT2Translator.from_dir(out, threads=1)
    itos = full.text.src_vocab.itos
    src = [[itos[i] for i in full.text.text_to_ids(s, "src")[1:-1]] for s in SENTENCES if s]
    tgt = [r.hypotheses[0] for r in full.engine.translate_batch(src, beam_size=1, max_decoding_length=20)]
    a, b = full.engine.score_batch(src, tgt), small.engine.score_batch(src, tgt)  # the same pairs, scored twice
    diffs = [abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.log_probs, rb.log_probs)]
    # Quantised (not the same weights), and close. How close depends on the CPU's int8 products: with VNNI (Intel
    # AVX512-VNNI or AVX-VNNI, AMD Zen 4/5) they are exact, measured max 0.009, mean 0.003; an AVX2-only CPU sums
    # pairs of u8*s8 products in 16 bits, which saturate: max 0.34, mean 0.17 (MKL limited to AVX2 on an AMX CPU).
    bound_max, bound_mean = (0.1, 0.02) if int8_products_exact() else (1.0, 0.3)
    assert 0 < max(diffs) < bound_max and sum(diffs) / len(diffs) < bound_mean


def test_export_refuses_an_existing_folder_and_keeps_it(tiny_checkpoint, tmp_path, command):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    for extra in ((), ("--overwrite",), ("--force",)):  # --overwrite replaces only an earlier export's folder
        code, _, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out, *extra)
        err = stderr.decode().strip()
        assert code == 2 and len(err.splitlines()) == 1 and "--overwrite" in err, err
        assert ("already exists" if not extra else "is not a folder written by export") in err, err
        assert sorted(p.name for p in out.iterdir()) == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no temporary folder left behind
    empty = tmp_path / "made_for_it"  # an empty folder replaces nothing: taken without --overwrite
    empty.mkdir()
    code, _, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", empty)
    assert code == 0 and (empty / "model.bin").is_file(), stderr.decode()


def test_export_overwrite_replaces_an_earlier_export(tiny_checkpoint, tmp_path, command):
    out = tmp_path / "ct2"
    code, _, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out)
    assert code == 0, stderr.decode()
    first = sorted(p.name for p in out.iterdir())
    (out / "model.bin").write_bytes(b"the earlier export")
    (out / "model.val.beam1.txt").write_text("hypotheses of evaluate\n")  # what evaluate writes in an export
    (out / "model.val.first5.beam1.txt").write_text("hypotheses of evaluate --limit 5\n")
    (out / "model.val.alpha1.beam2.txt").write_text("hypotheses of evaluate --beam 2 --alpha 1\n")
    (out / "eval").mkdir()
    (out / "eval" / "news.de.beam1.txt").write_text("hypotheses of evaluate --input\n")
    code, stdout, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out)
    assert code == 2 and "already exists" in stderr.decode()
    assert (out / "model.bin").read_bytes() == b"the earlier export"
    code, stdout, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out, "--overwrite")
    assert code == 0, stderr.decode()
    assert sorted(p.name for p in out.iterdir()) == first  # the earlier hypotheses went with their model, said so
    assert stdout.decode().startswith("--overwrite: removed the earlier export's hypotheses with it (eval/news.de."
                                      "beam1.txt, model.val.alpha1.beam2.txt, model.val.beam1.txt, "
                                      "model.val.first5.beam1.txt)\n")
    assert (out / "model.bin").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # the old folder removed, no temporary left


def test_export_overwrite_that_cannot_delete_the_old_copy_says_so_and_succeeds(tiny_checkpoint, tmp_path, command,
                                                                              monkeypatch):
    """A read-only earlier export: the new one is in place, so a failure to delete the old copy (moved aside) is a
    warning naming where it is; it was an error, exit 2, though the export had succeeded."""
    import errno
    import os

    from annotated_transformer.deploy import ct2_export

    out = tmp_path / "ct2"
    assert command("export", "--checkpoint", tiny_checkpoint, "--out", out)[0] == 0
    (out / "model.bin").write_bytes(b"the earlier export")
    (out / "model.val.beam1.txt").write_text("hypotheses of evaluate\n")  # kept aside with it: not said removed

    def refused(folder):
        raise PermissionError(errno.EACCES, "Permission denied", str(folder / "model.bin"))

    monkeypatch.setattr(ct2_export, "_remove_export", refused)
    code, stdout, stderr = command("export", "--checkpoint", tiny_checkpoint, "--out", out, "--overwrite")
    old = tmp_path / f".ct2.old-{os.getpid()}"
    assert "removed the earlier export's hypotheses" not in stdout.decode()
    assert code == 0 and stderr.decode().splitlines() == [
        f"warning: the earlier export, moved aside to {old}, could not be deleted (Permission denied); delete it "
        "yourself"], stderr.decode()
    assert (out / "model.bin").stat().st_size > 1000 and (old / "model.bin").read_bytes() == b"the earlier export"


@pytest.mark.parametrize("args, message", [
    (("--engine", "ctranslate2", "--checkpoint", "{checkpoint}"), "is a PyTorch checkpoint; drop --engine"),
    (("--engine", "torch", "--checkpoint", "{exported}"), "is an exported model folder; drop --engine"),
    (("--engine", "ctranslate2", "--checkpoint", "{missing}"), "model.bin is missing"),
    (("--checkpoint", "{exported}", "--quantize", "int8"), "quantised when exported (export --quantize int8)"),
    (("--checkpoint", "{exported}", "--quantize", "bf16"), "quantised when exported (export --quantize bf16)"),
])
def test_wrong_engine_arguments_are_one_line(tmp_path, tiny_checkpoint, exported, args, message, command):
    args = tuple(a.format(missing=tmp_path / "nothing", checkpoint=tiny_checkpoint, exported=exported) for a in args)
    code, stdout, stderr = command("translate", *args, stdin=b"Ein Mann.\n")
    err = stderr.decode().strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert stdout == b""


def test_an_exported_model_on_cuda_without_a_gpu_is_one_line(exported, command, monkeypatch):
    monkeypatch.setattr(ct2, "get_cuda_device_count", lambda: 0)  # as on a machine without a usable GPU
    code, stdout, stderr = command("translate", "--checkpoint", exported, "--device", "cuda", stdin=b"Ein Mann.\n")
    assert code == 2 and stdout == b""
    assert stderr.decode() == "error: --device cuda, but CTranslate2 finds no usable CUDA GPU here; use --device cpu\n"
    code, _, stderr = command("translate", "--checkpoint", exported, "--merge-ratio", "0.2", stdin=b"Ein Mann.\n")
    assert code == 2 and "need the PyTorch model (a run directory or a model file)" in stderr.decode()


def test_an_exported_model_takes_the_gpu_numbered_as_torch_numbers_them(exported, monkeypatch):
    """--device cuda:N, as commands.md says, is CTranslate2's device_index N (it was "not a CTranslate2 device")."""
    from annotated_transformer.deploy.translator import load_translator
    from annotated_transformer.runtime.errors import ConfigError

    asked = []
    monkeypatch.setattr(ct2, "get_cuda_device_count", lambda: 2)
    monkeypatch.setattr(ct2, "Translator", lambda path, **kwargs: asked.append(kwargs))
    load_translator(exported, device="cuda:1")
    load_translator(exported, device="cuda")
    assert [(a["device"], a["device_index"]) for a in asked] == [("cuda", 1), ("cuda", 0)]
    for device, message in (("cuda:2", "--device cuda:2, but CTranslate2 finds 2 CUDA GPUs here (cuda:0 to cuda:1)"),
                            ("mps", "--device mps is not a CTranslate2 device; use cpu, cuda or cuda:N"),
                            ("cuda:x", "--device cuda:x is not a CTranslate2 device; use cpu, cuda or cuda:N"),
                            ("cuda:", "--device cuda: is not a CTranslate2 device; use cpu, cuda or cuda:N"),
                            ("cuda:²", "--device cuda:² is not a CTranslate2 device; use cpu, cuda or cuda:N")):
        with pytest.raises(ConfigError) as refused:
            load_translator(exported, device=device)
        assert str(refused.value) == message


# ---------------------------------------------------------------- benchmark --engines


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_engine_comparison_on_a_trained_checkpoint(tiny_checkpoint, multi30k_dir, tmp_path, command, monkeypatch):
    """The engine table on 12 test sentences. Each engine is measured in this process here (the benchmark's own
    fresh processes are tested by test_benchmark.py's training sides, which use the same helper)."""
    import json

    from annotated_transformer.lab import hardware

    monkeypatch.setattr(hardware, "in_fresh_process", lambda what, fn, *args: fn(*args))
    code, stdout, stderr = command("benchmark", "--config", "tiny", f"data.root={multi30k_dir}", "--engines",
                                   "--checkpoint", tiny_checkpoint, "--sentences", "12", "--out", tmp_path, "--json")
    assert code == 0, stderr.decode()[-2000:]
    result = json.loads(stdout)
    assert result == json.loads((tmp_path / "engines.json").read_text())
    rows = {row["engine"]: row for row in result["rows"]}
    assert {"torch-fp32", "torch-int8", "ct2-float32", "ct2-int8"} <= set(rows) and result["sentences"] == 12
    assert rows["torch-fp32"]["greedy_ratio"] == 1.0 and rows["ct2-float32"]["same_as_torch_fp32"] == 1.0
    assert rows["ct2-float32"]["bleu"] == pytest.approx(rows["torch-fp32"]["bleu"])
    for row in rows.values():
        assert row["greedy_ratio"] == pytest.approx(row["greedy_per_s"] / rows["torch-fp32"]["greedy_per_s"])
        assert row["peak_mem_gb"] > 0 and row["latency_ms"] > 0 and row["threads"] == result["threads"]


def test_engine_comparison_needs_a_checkpoint(command):
    code, _, stderr = command("benchmark", "--config", "tiny", "--engines")
    err = stderr.decode().strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pass --checkpoint" in err, err


# ---------------------------------------------------------------- our decoder, int8 (--quantize int8)


def test_quantize_int8_keeps_the_log_probs_close(tiny_checkpoint, multi30k_data):
    from annotated_transformer import Translator

    full, small = (Translator.from_checkpoint(tiny_checkpoint, device="cpu") for _ in range(2))
    small.quantize_int8()
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    modules = list(small.model.modules())
    assert sum(isinstance(m, DynamicQuantizedLinear) for m in modules) == sum(
        isinstance(m, torch.nn.Linear) for m in full.model.modules())  # every linear layer, the generator's too
    assert not any(isinstance(m, torch.nn.Linear) for m in modules)
    src = torch.tensor([multi30k_data.splits["val"].src[0].tolist()])  # (1, S): <s> ... </s>
    tgt = torch.tensor([[0, 5, 6, 7, 8]])
    with torch.no_grad():
        a, b = (t.model.generator(t.model(src, tgt, (src != 2).unsqueeze(-2), subsequent_mask(5)))
                for t in (full, small))
    diff = (a - b).abs()
    assert 0 < diff.mean() < 0.05  # quantised (not the same weights), and close


# ---------------------------------------------------------------- our decoder, bf16 weights (--quantize bf16)


def test_to_bf16_keeps_the_log_probs_close(tiny_checkpoint, multi30k_data, monkeypatch):
    from annotated_transformer import Translator
    from annotated_transformer.deploy import translator as translator_module

    monkeypatch.setattr(translator_module, "native_bf16", lambda device: True)  # bf16 runs (slowly) on any CPU
    full, half = (Translator.from_checkpoint(tiny_checkpoint, device="cpu") for _ in range(2))
    assert half.to_bf16() is half and half.amp_dtype is None
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in full.model.parameters()} == {torch.float32}
    src = torch.tensor([multi30k_data.splits["val"].src[0].tolist()])  # (1, S): <s> ... </s>
    tgt = torch.tensor([[0, 5, 6, 7, 8]])
    with torch.no_grad():
        a, b = (t.model.generator(t.model(src, tgt, (src != 2).unsqueeze(-2), subsequent_mask(5))).float()
                for t in (full, half))
    diff = (a - b).abs()
    assert 0 < diff.mean() < 0.1  # rounded to bf16 (not the same numbers), and close
    sentences = SENTENCES[:1] + SENTENCES[2:]
    for beam in (1, 3):  # beam search ranks bf16 logits in fp32
        outputs = half.translate(sentences, beam=beam)
        assert len(outputs) == len(sentences) and all(isinstance(o, str) and o for o in outputs)


def test_quantize_bf16_without_native_bf16_is_one_line(tiny_checkpoint, command, monkeypatch):
    from annotated_transformer.deploy import translator as translator_module

    monkeypatch.setattr(translator_module, "native_bf16", lambda device: False)
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--quantize",
                                   "bf16", stdin=b"Ein Mann.\n")
    err = stderr.decode().strip()
    assert code == 2 and len(err.splitlines()) == 1 and "needs native bf16" in err and "drop it" in err, err
    assert stdout == b""


@pytest.mark.parametrize("quantize", ["int8", "bf16"])
def test_translate_quantize(tiny_checkpoint, command, monkeypatch, quantize):
    from annotated_transformer.deploy import translator as translator_module

    monkeypatch.setattr(translator_module, "native_bf16", lambda device: True)  # bf16 runs (slowly) on any CPU
    seen = []  # the model each translation ran on: its linear layers' class and weight type
    real = translator_module.Translator.translate_ids

    def spy(self, *args, **kwargs):
        linear = next(m for m in self.model.modules() if "Linear" in type(m).__name__)
        seen.append((type(linear).__module__, next(self.model.parameters()).dtype))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(translator_module.Translator, "translate_ids", spy)
    stdin = "\n".join(SENTENCES).encode()
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--quantize",
                                   quantize, stdin=stdin)
    assert code == 0, stderr.decode()
    lines = stdout.decode().split("\n")[:-1]
    assert len(lines) == len(SENTENCES) and lines[1] == "" and all(lines[i] for i in (0, 2, 3))
    module, dtype = seen[0]
    assert ("quantized" in module) == (quantize == "int8") and (dtype == torch.bfloat16) == (quantize == "bf16")
