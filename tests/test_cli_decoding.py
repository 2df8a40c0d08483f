"""Decoding as a user meets it: Translator, scripts/translate.py, scripts/evaluate.py and
scripts/average_checkpoints.py on a tiny trained checkpoint, bad input included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from annotated_transformer import Translator
from annotated_transformer.decode.beam_search import beam_search
from annotated_transformer.decode.incremental import greedy_search
from annotated_transformer.decoding import greedy_decode
from annotated_transformer.checkpoints import load_checkpoint, save_checkpoint
from annotated_transformer.extensions.builder import build_model
from annotated_transformer.deploy.text_translator import TruncationWarning
from annotated_transformer.deploy.translator import set_token_reduction

SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "",
    "Zwei Hunde spielen im Schnee auf einer großen Wiese neben einem Haus.",
    "Eine Frau.",
    "   ",
    "Kinder spielen.",
]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, device="cpu")


def val_sources(multi30k_data, n: int) -> list[list[int]]:
    """The first n validation sources as id lists (<s> ... </s>), of mixed lengths."""
    return [ids.tolist() for ids in multi30k_data.splits["val"].src[:n]]


def padded(sources: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(s) for s in sources)
    src = torch.full((len(sources), S), pad, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
    return src, (src != pad).unsqueeze(-2)


# ---------------------------------------------------------------- the trained model's decoders


@pytest.mark.parametrize("B", [1, 16])
def test_cached_greedy_equals_naive_on_a_trained_model(translator, multi30k_data, B):
    text = translator.text
    src, mask = padded(val_sources(multi30k_data, B), text.pad_id)
    lengths = mask.sum(-1).squeeze(-1)
    max_len = lengths + 10  # per-sentence limits of mixed lengths
    with torch.no_grad():
        fast = greedy_search(translator.model, src, mask, max_len, text.bos_id, text.eos_id, text.pad_id)
        slow = greedy_decode(translator.model, src, mask, max_len, text.bos_id, text.eos_id, text.pad_id)
    assert torch.equal(fast, slow)


def test_beam_one_equals_greedy_on_a_trained_model(translator, multi30k_data):
    text = translator.text
    src, mask = padded(val_sources(multi30k_data, 12), text.pad_id)
    with torch.no_grad():
        g = greedy_search(translator.model, src, mask, 30, text.bos_id, text.eos_id, text.pad_id)
        b = beam_search(translator.model, src, mask, 30, text.bos_id, text.eos_id, beam_size=1, pad_symbol=text.pad_id)
    assert torch.equal(g, b)


def test_translator_keeps_input_order_and_empty_lines(translator):
    together = translator.translate(SENTENCES, batch_size=2)  # length-sorted batches of two
    alone = [translator.translate([s])[0] for s in SENTENCES]
    assert together == alone
    assert together[1] == "" and together[4] == ""
    assert all(together[i] for i in (0, 2, 3, 5))


def test_translator_refuses_a_copy_task_checkpoint(tmp_path, tiny_checkpoint):
    payload = load_checkpoint(tiny_checkpoint)
    payload["text"] = None
    save_checkpoint(payload, tmp_path / "copy.pt")
    with pytest.raises(Exception, match="without a text vocabulary"):
        Translator.from_checkpoint(tmp_path / "copy.pt")


# ---------------------------------------------------------------- translate (in this process, through
# annotated_transformer.cli: what scripts/translate.py runs; test_cli.py runs it as a process at a pipe and a terminal)


def test_translate_one_line_out_per_line_in(tiny_checkpoint, translator, command):
    stdin = "\n".join(SENTENCES).encode("utf-8") + b"\n"
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", stdin=stdin)
    assert code == 0, stderr.decode()
    lines = stdout.decode("utf-8").split("\n")
    assert lines[-1] == ""  # every output line ends with a newline
    assert lines[:-1] == translator.translate(SENTENCES)
    assert stderr == b""  # nothing to warn about


def test_translate_reads_a_file_and_beam(tiny_checkpoint, translator, tmp_path, command):
    src = tmp_path / "de.txt"
    src.write_text("\n".join(SENTENCES[:4]) + "\n", encoding="utf-8")
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--input", src, "--beam", "3",
                                   "--device", "cpu")
    assert code == 0, stderr.decode()
    beam = translator.translate(SENTENCES[:4], beam=3)
    assert stdout.decode("utf-8").splitlines() == beam


def test_translate_n_best_prints_each_hypothesis_with_its_score(tiny_checkpoint, translator, command):
    sentences = ["Ein Mann fährt Fahrrad.", "Eine Frau."]
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--beam", "3",
                                   "--n-best", "2", stdin="\n".join(sentences).encode() + b"\n")
    assert code == 0, stderr.decode()
    expected = translator.translate(sentences, beam=3, n_best=2)
    assert [line.split("\t") for line in stdout.decode().splitlines()] == [
        [str(number), f"{h.score:.4f}", h.text] for number, found in enumerate(expected, 1) for h in found]
    assert [len(found) for found in expected] == [2, 2]
    code, _, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--n-best", "2", "Ein Mann.")
    assert code == 2 and stderr.decode() == ("error: --n-best 2 needs a beam at least as wide: add --beam 2 (the beam "
                                             "is 1)\n")


def test_translate_prunes_or_merges_tokens_as_the_translator_does(tiny_checkpoint, command):
    pruned = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    set_token_reduction(pruned, None, 0.4)
    assert (pruned.model.mode, pruned.model.ratio) == ("prune", 0.4)
    stdin = "\n".join(SENTENCES[:4]).encode("utf-8") + b"\n"
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--prune-ratio",
                                   "0.4", stdin=stdin)
    assert code == 0, stderr.decode()
    assert stdout.decode("utf-8").splitlines() == pruned.translate(SENTENCES[:4])
    code, _, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--merge-ratio", "0.2", "--prune-ratio",
                              "0.2", stdin=stdin)
    assert code == 2 and stderr.decode() == "error: --merge-ratio and --prune-ratio: use one of them\n"


def test_translate_truncates_a_long_line_with_a_warning(tiny_checkpoint, translator, command):
    limit = translator.text.max_sentence_len
    long_line = " ".join(["Hund"] * (limit + 20))
    stdin = f"Ein Mann.\n{long_line}\nEine Frau.\n".encode()
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", stdin=stdin)
    assert code == 0, stderr.decode()
    with pytest.warns(TruncationWarning, match="^1 of 3 sentences was longer"):  # the API's, not on the command line
        assert stdout.decode().splitlines() == translator.translate(["Ein Mann.", long_line, "Eine Frau."])
    warnings = stderr.decode().strip().splitlines()
    assert len(warnings) == 1
    assert "line 2" in warnings[0] and "truncated" in warnings[0] and str(limit) in warnings[0]
    code, _, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "Ein Mann.", long_line)
    assert code == 0 and stderr.decode().startswith("warning: sentence 2 is longer"), stderr.decode()  # no lines


def test_translate_reads_gzip_input_and_an_empty_input_gives_an_empty_output(tiny_checkpoint, tmp_path, command):
    """--input FILE.gz reads as evaluate's --input does (it was "not valid UTF-8"); a cut .gz is one line; an empty
    file, or an empty pipe, is an empty output and a warning, alike (the file was refused, the pipe not)."""
    import gzip

    plain, packed, cut = tmp_path / "de.txt", tmp_path / "de.txt.gz", tmp_path / "cut.txt.gz"
    plain.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\n", encoding="utf-8")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    cut.write_bytes(packed.read_bytes()[:-12])
    run = ("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu")
    code, expected, stderr = command(*run, "--input", plain)
    assert code == 0 and len(expected.splitlines()) == 2, stderr.decode()
    code, stdout, stderr = command(*run, "--input", packed)
    said = [line for line in stderr.decode().splitlines() if line.startswith(("error", "warning"))]
    assert code == 0 and stdout == expected and said == [], stderr.decode()
    code, _, stderr = command(*run, "--input", cut)
    lines = stderr.decode().splitlines()
    assert code == 2 and len(lines) == 1 and f"{cut} is not a complete gzip file" in lines[0], lines
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for name, args, stdin in ((empty, ("--input", empty), b""), ("standard input", (), b"")):
        out = tmp_path / "out.txt"
        code, stdout, stderr = command(*run, *args, "--out", out, "--overwrite", stdin=stdin)
        assert code == 0 and stdout == b"" and out.read_bytes() == b"", stderr.decode()
        assert f"warning: {name} is empty: nothing to translate" in stderr.decode().splitlines()


def test_translate_skips_the_byte_order_mark_of_a_utf8_file(tiny_checkpoint, tmp_path, command):
    """A BOM (what some editors write first in a UTF-8 file) is no part of the first sentence: it was translated."""
    text = "\n".join(SENTENCES[:2]).encode("utf-8") + b"\n"
    src = tmp_path / "de.txt"
    src.write_bytes(b"\xef\xbb\xbf" + text)
    run = ("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", "--n-best", "1")  # with the scores
    code, plain, stderr = command(*run, stdin=text)
    assert code == 0 and len(plain.splitlines()) == 2, stderr
    for args, stdin in ((("--input", src), b""), ((), b"\xef\xbb\xbf" + text)):
        code, stdout, stderr = command(*run, *args, stdin=stdin)
        assert code == 0 and stdout == plain, stderr


@pytest.mark.parametrize("args, stdin, needle", [
    ([], "Straße\n".encode("latin-1") + b"Ein Mann.\n", "not UTF-8 text: line 1 has the byte 0xdf"),
    (["--beam", "0"], b"Ein Mann.\n", "--beam must be at least 1"),
    (["--alpha", "nan"], b"Ein Mann.\n", "--alpha must be a number of at least 0, got nan"),
    (["--alpha", "inf"], b"Ein Mann.\n", "--alpha must be a number of at least 0, got inf"),
    (["--input", "/nonexistent/de.txt"], b"", "cannot read /nonexistent/de.txt"),
    (["--input", ""], b"", "argument --input: an empty path"),
    (["--out", ""], b"Ein Mann.\n", "argument --out: an empty path"),  # it wrote into the current folder
    # bytes that are not UTF-8 in an argument (Python keeps them as surrogates): a traceback at the output
    (["Ein Mann.", "Ein Hund \udce4uft."], b"", "sentence 2 given as an argument is not UTF-8 text (it has the byte "
     "0xe4); set the terminal to UTF-8"),
])
def test_translate_bad_input_is_one_clear_line(tiny_checkpoint, args, stdin, needle, command):
    code, stdout, stderr = command("translate", "--checkpoint", tiny_checkpoint, "--device", "cpu", *args,
                                   stdin=stdin)
    assert code == 2
    err = stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert stdout == b""


# ---------------------------------------------------------------- evaluate (in this process)


def test_evaluate_json(tiny_checkpoint, multi30k_dir, tmp_path, command, word_mode_scores):
    hyp_file = tmp_path / "hyps.txt"
    code, stdout, stderr = command("evaluate", "--checkpoint", tiny_checkpoint, "--split", "val", "--limit", "20",
                                   "--json", "--output", hyp_file, "--data-root", multi30k_dir, "--device", "cpu",
                                   "--show", "2")
    assert code == 0, stderr.decode()
    result = json.loads(stdout)  # stdout is exactly one JSON object
    assert result["split"] == "val" and result["beam"] == 1 and result["sentences"] == 20 and result["seconds"] > 0
    # word mode: the headline is the lowercased tokenised BLEU; the signature says so
    assert "tok:none" in result["signature"] and "case:lc" in result["signature"]
    assert result["headline"] == "bleu_lc" and result["bleu"] == result["scores"]["bleu_lc"]["score"]
    assert set(result["scores"]) == {"bleu", "bleu_lc", "chrf"}
    hyps = hyp_file.read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 21 and hyps[-1] == ""
    # every figure equals sacreBLEU's own on these hypotheses against the spaCy-tokenised references
    expected = word_mode_scores(hyps[:-1], "val")
    for key, value in expected.items():
        assert result["scores"][key]["score"] == pytest.approx(value, abs=1e-9), key
    assert expected["chrf"] > 0  # a score that moves: the outputs share characters with the references
    shown = stderr.decode()  # --show goes to stderr with --json: the first two examples
    shown_as = {kind: [line.strip().partition(" ")[2].strip() for line in shown.splitlines()
                       if line.strip().startswith(kind)] for kind in ("source", "model")}
    assert shown_as == {"source": _val_sources(multi30k_dir, 2), "model": hyps[:2]}


def test_evaluate_text_output_names_signatures(tiny_checkpoint, multi30k_dir, tmp_path, command):
    code, stdout, stderr = command("evaluate", "--checkpoint", tiny_checkpoint, "--split", "test", "--limit", "8",
                                   "--output", tmp_path / "h.txt", "--data-root", multi30k_dir, "--device", "cpu")
    assert code == 0, stderr.decode()
    out = stdout.decode()
    assert "test: 8 sentences, beam 1" in out
    scored = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(scored) == {"bleu", "bleu_lc", "chrf"}
    assert all("nrefs:1" in line and "version:" in line for line in scored.values())  # each with its signature
    assert "case:lc" in scored["bleu_lc"] and "case:mixed" in scored["bleu"]


def test_evaluate_refuses_a_bad_beam(tiny_checkpoint, command):
    code, _, stderr = command("evaluate", "--checkpoint", tiny_checkpoint, "--beam", "-1")
    assert code == 2
    assert stderr.decode() == "error: --beam must be at least 1, got -1\n"
    code, stdout, stderr = command("evaluate", "--checkpoint", tiny_checkpoint, "--show", "-1")  # a blank line
    assert code == 2 and stdout == b"" and stderr.decode() == "error: --show must be 0 or more, got -1\n"


def test_evaluate_merges_tokens_at_inference_only(tiny_checkpoint, multi30k_dir, tmp_path, command):
    common = ("--checkpoint", tiny_checkpoint, "--split", "val", "--limit", "30", "--json",
              "--data-root", multi30k_dir, "--device", "cpu")
    code, stdout, stderr = command("evaluate", *common, "--output", tmp_path / "merged.txt", "--merge-ratio", "0.4")
    assert code == 0, stderr.decode()
    assert json.loads(stdout)["sentences"] == 30
    merged = (tmp_path / "merged.txt").read_text().splitlines()
    reference = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    set_token_reduction(reference, 0.4, None)
    assert merged == reference.translate(_val_sources(multi30k_dir, 30))  # the merging translator's outputs
    assert load_checkpoint(tiny_checkpoint)["config"]["token_merging"]["merge_ratio"] == 0.0  # the checkpoint unchanged
    code, _, stderr = command("evaluate", *common, "--merge-ratio", "0.9")
    assert code == 2 and stderr.decode() == "error: --merge-ratio must be in [0, 0.5], got 0.9\n"


def test_evaluate_names_merged_hypotheses_apart_from_the_models_own(tiny_checkpoint, multi30k_dir, tmp_path, command):
    import shutil

    model = tmp_path / "model.safetensors"  # a copy: the hypotheses go beside it
    shutil.copy(tiny_checkpoint, model)
    common = ("evaluate", "--checkpoint", model, "--split", "val", "--limit", "20", "--data-root", multi30k_dir,
              "--device", "cpu")
    assert command(*common)[0] == 0
    code, stdout, stderr = command(*common, "--merge-ratio", "0.4")  # not refused as the same file
    assert code == 0, stderr.decode()
    assert "beam 1, token merging 0.4," in stdout.decode()
    assert command(*common, "--merge-ratio", "0")[0] == 0  # given, if 0: named too (it turns a trained merging off)
    code, stdout, stderr = command(*common, "--merge-ratio", "0.4000001")  # as given: it was merge0.4's file
    assert code == 0 and "beam 1, token merging 0.4000001," in stdout.decode(), stderr.decode()
    assert sorted(p.name for p in tmp_path.glob("*.txt")) == ["model.val.first20.beam1.txt",
                                                              "model.val.first20.merge0.4.beam1.txt",
                                                              "model.val.first20.merge0.4000001.beam1.txt",
                                                              "model.val.first20.merge0.beam1.txt"]


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_evaluate_names_int8_and_other_alpha_hypotheses_apart(tiny_checkpoint, multi30k_dir, tmp_path, command):
    """--quantize int8 and an --alpha other than the checkpoint's (with a beam) decode differently: files of their own
    (both were refused as the full-precision file, or replaced it with --overwrite), which train.overwrite knows."""
    import shutil

    from annotated_transformer.harness.run_dir import OWN_NAMES

    model = tmp_path / "model.safetensors"
    shutil.copy(tiny_checkpoint, model)
    alpha = load_checkpoint(model)["config"]["decode"]["alpha"]
    common = ("evaluate", "--checkpoint", model, "--split", "val", "--limit", "8", "--data-root", multi30k_dir,
              "--device", "cpu")
    near = alpha + 1e-7  # named as given: `:g` wrote it as the default's alpha, 0.6 for 0.6000001
    for extra in ((), ("--quantize", "int8"), ("--beam", "2"), ("--beam", "2", "--alpha", str(alpha + 0.5)),
                  ("--beam", "2", "--alpha", str(near))):
        code, stdout, stderr = command(*common, *extra)
        assert code == 0, stderr.decode()
        assert ("beam 1, int8 weights," in stdout.decode()) == (extra == ("--quantize", "int8")), stdout.decode()
    code, stdout, _ = command(*common, "--quantize", "int8", "--json", "--overwrite")
    assert json.loads(stdout)["quantize"] == "int8"
    for same in (("--alpha", "0"), ("--beam", "2", "--alpha", str(alpha))):  # greedy has no alpha; the same alpha
        code, _, stderr = command(*common, *same)
        assert code == 2 and "already exists" in stderr.decode()
    names = sorted(p.name for p in tmp_path.glob("*.txt"))
    assert names == sorted(["model.val.first8.alpha" + f"{alpha + 0.5:g}" + ".beam2.txt", "model.val.first8.beam1.txt",
                            f"model.val.first8.alpha{near!r}.beam2.txt", "model.val.first8.beam2.txt",
                            "model.val.first8.int8.beam1.txt"])
    assert all(OWN_NAMES.match(name.replace("model.", "best.", 1)) for name in names)


def _val_sources(multi30k_dir: Path, n: int) -> list[str]:
    import gzip

    with gzip.open(multi30k_dir / "val.de.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f.read().split("\n")[:n]]


# ---------------------------------------------------------------- average (in this process)


def test_average_checkpoints(tiny_checkpoint, tmp_path, command):
    payload = load_checkpoint(tiny_checkpoint)
    shifted = dict(payload, model={k: v + 1.0 if v.is_floating_point() else v for k, v in payload["model"].items()})
    save_checkpoint(shifted, tmp_path / "shifted.pt")  # an older version's .pt file, averaged with a model file
    out = tmp_path / "avg.safetensors"
    code, stdout, stderr = command("average", tiny_checkpoint, tmp_path / "shifted.pt", "--output", out)
    assert code == 0, stderr.decode()
    assert stdout.decode() == f"averaged 2 checkpoints into {out} (config and vocabulary inside)\n"
    avg = load_checkpoint(out)
    for k, v in payload["model"].items():
        if v.is_floating_point():
            torch.testing.assert_close(avg["model"][k], v + 0.5, rtol=0, atol=1e-6)
    tr = Translator.from_checkpoint(out, device="cpu")  # the average is a usable checkpoint
    assert len(tr.translate(["Ein Mann fährt Fahrrad."])) == 1
    one = tmp_path / "one.safetensors"  # one file is a copy of its weights, said in the singular
    code, stdout, stderr = command("average-checkpoints", tiny_checkpoint, "--out", one)
    assert code == 0 and stdout.decode() == f"averaged 1 checkpoint into {one} (config and vocabulary inside)\n"


def test_average_checkpoints_warns_of_two_runs_and_a_runs_average_is_of_its_own(tiny_checkpoint, tmp_path, command):
    """Two runs' weights (another seed) average to a poor model: said, not refused (a run may go on with another
    seed); a run's avg file is written only from that run's checkpoints (another run's went into it)."""
    import shutil

    payload = load_checkpoint(tiny_checkpoint)
    seed, folder = payload["config"]["train"]["seed"], payload["config"]["train"]["out_dir"]
    cfg = json.loads(json.dumps(payload["config"]))
    cfg["train"]["seed"] = seed + 1
    cfg["train"]["out_dir"] = f"{folder}/./"  # the same run, continued with another seed (its folder spelt
    continued = tmp_path / "continued.pt"    # another way): one run
    save_checkpoint(dict(payload, config=cfg), continued)
    cfg["train"]["out_dir"] = str(tmp_path / "another")
    other = tmp_path / "other_run.pt"
    save_checkpoint(dict(payload, config=cfg), other)
    out = tmp_path / "avg.safetensors"
    code, _, stderr = command("average-checkpoints", tiny_checkpoint, continued, "--out", out)
    assert code == 0 and stderr == b""
    code, _, stderr = command("average-checkpoints", tiny_checkpoint, other, "--out", out, "--overwrite")
    assert code == 0 and stderr.decode() == (
        f"warning: {other} comes from another run than {tiny_checkpoint} (train.seed={seed + 1} in "
        f"{tmp_path / 'another'}, not {seed} in {folder}): the weights of two runs average to a model worse than "
        "either; average checkpoints of one run\n")
    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent, run)
    code, _, stderr = command("average-checkpoints", other, "--out", run / "avg.safetensors")
    assert code == 2 and stderr.decode().startswith(f"error: --out {run / 'avg.safetensors'} is the average of the "
                                                    f"run in {run}, which only that run's own checkpoints make")
    assert not (run / "avg.safetensors").exists()
    code, _, stderr = command("average-checkpoints", run, "--out", run / "avg.safetensors")  # a folder: no checkpoint
    assert code == 2 and "is a directory" in stderr.decode(), stderr.decode()
    code, _, stderr = command("average-checkpoints", run / "best.safetensors", "--out", run / "avg.safetensors")
    assert code == 0 and (run / "avg.safetensors").is_file(), stderr.decode()


def test_average_checkpoints_refuses_another_architecture(tiny_checkpoint, tmp_path, command):
    payload = load_checkpoint(tiny_checkpoint)
    cfg = json.loads(json.dumps(payload["config"]))
    cfg["model"]["d_ff"] *= 2
    from annotated_transformer.config import config_from_dict

    other = build_model(config_from_dict(cfg), payload["model"]["src_embed.0.lut.weight"].shape[0],
                        payload["model"]["tgt_embed.0.lut.weight"].shape[0])
    save_checkpoint(dict(payload, config=cfg, model=other.state_dict()), tmp_path / "wide.pt")
    out = tmp_path / "avg.safetensors"
    code, _, stderr = command("average", tiny_checkpoint, tmp_path / "wide.pt", "--output", out)
    assert code == 2
    err = stderr.decode().strip()
    assert err.startswith("error: ") and "different architecture" in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wide.pt"]


def test_average_checkpoints_refuses_a_file_given_twice(tiny_checkpoint, tmp_path, command):
    link = tmp_path / "same.safetensors"  # another spelling of the same file
    link.symlink_to(tiny_checkpoint)
    out = tmp_path / "avg.safetensors"
    for twice in ([tiny_checkpoint, tiny_checkpoint], [tiny_checkpoint, link]):
        code, _, stderr = command("average-checkpoints", *twice, "--out", out)
        err = stderr.decode()
        assert code == 2 and "is the same file as" in err and "give each checkpoint once" in err, err
        assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.safetensors"]


def test_average_checkpoints_refuses_another_vocabulary(tiny_checkpoint, tmp_path, command):
    payload = load_checkpoint(tiny_checkpoint)
    text = dict(payload["text"], tgt_vocab=list(payload["text"]["tgt_vocab"]))
    text["tgt_vocab"][4], text["tgt_vocab"][5] = text["tgt_vocab"][5], text["tgt_vocab"][4]  # same size, other ids
    save_checkpoint(dict(payload, text=text), tmp_path / "other_vocab.pt")
    code, _, stderr = command("average", tiny_checkpoint, tmp_path / "other_vocab.pt", "--output", tmp_path / "avg.pt")
    assert code == 2
    assert "different vocabulary" in stderr.decode() and stderr.decode().count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_vocab.pt"]
