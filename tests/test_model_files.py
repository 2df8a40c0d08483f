"""The model files a user ships (NAME.safetensors + NAME.json): their size, tied weights stored once and tied again
on load, the same outputs after a round trip, older .pt files still loading, and one line for a damaged file."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from annotated_transformer.config import config_from_dict, config_to_dict, load_config
from annotated_transformer.data.text import TextPipeline
from annotated_transformer.deploy.translator import Translator, resolve_checkpoint
from annotated_transformer.runtime.errors import CheckpointError
from annotated_transformer.extensions.builder import build_model
from annotated_transformer.harness.checkpointing import (CheckpointWriter, average_checkpoints_into, load_checkpoint,
                                                         save_checkpoint, save_weights)
from annotated_transformer.masks import subsequent_mask

SRC, TGT, GEN = "src_embed.0.lut.weight", "tgt_embed.0.lut.weight", "generator.proj.weight"
CPU_15MIN_VOCAB = 8000  # cpu_15min.yaml's data.spm_vocab_size: one vocabulary, tied embeddings


def unique_parameter_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's parameters, a tied matrix counted once, at their dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weights_payload(cfg, model: torch.nn.Module, text: TextPipeline | None = None) -> dict:
    """What training writes to its best model file."""
    return {"config": config_to_dict(cfg), "model": model.state_dict(),
            "text": None if text is None else text.state_dict(), "train_state": {"epoch": 3, "step": 90}}


def stored(path: Path) -> tuple[set[str], dict[str, str]]:
    """The tensor names a .safetensors file holds, and the tied names its metadata records."""
    with safe_open(path, framework="pt") as f:
        return set(f.keys()), json.loads(f.metadata()["tied"])


def logits(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The generator's log-probabilities for teacher-forced `tgt` after `src` (no padding)."""
    with torch.no_grad():
        out = model(src, tgt, torch.ones(src.shape[0], 1, src.shape[1], dtype=torch.bool),
                    subsequent_mask(tgt.shape[1]))
        return model.generator(out)


@pytest.fixture(scope="module")
def cpu_15min_model():
    """A model of cpu_15min.yaml's shape (3 layers of width 256, 8,000 tied embeddings), not trained."""
    cfg = load_config("cpu_15min")
    torch.manual_seed(0)
    return cfg, build_model(cfg, CPU_15MIN_VOCAB, CPU_15MIN_VOCAB).eval()


@pytest.fixture(scope="module")
def spm_text(multi30k_dir: Path) -> TextPipeline:
    """A joint SentencePiece vocabulary of 200 pieces, trained in about a second on 500 Multi30k val pairs."""
    sides = []
    for lang in ("de", "en"):
        with gzip.open(multi30k_dir / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().split("\n")[:500])
    return TextPipeline.for_subwords(*sides, src_lang="de", tgt_lang="en", vocab_size=200, max_sentence_len=32)


# ---------------------------------------------------------------- size: the unique parameters, once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_15min_model_file_is_its_unique_parameters_once(cpu_15min_model, dtype, tmp_path):
    cfg, model = cpu_15min_model
    model = copy.deepcopy(model).to(dtype)  # deepcopy keeps the tie
    assert model.num_parameters() > 7_500_000  # the shape of cpu_15min's 7.6M parameters
    weights, settings = save_weights(weights_payload(cfg, model), tmp_path / "best")
    assert (weights.name, settings.name) == ("best.safetensors", "best.json")
    size = weights.stat().st_size
    assert size <= 1.1 * unique_parameter_bytes(model), (size, unique_parameter_bytes(model))
    names, tied = stored(weights)
    assert SRC in names and TGT not in names and GEN not in names
    assert tied == {TGT: SRC, GEN: SRC}
    assert settings.stat().st_size < 10_000  # the config and counters: no weights in the JSON


def test_the_tiny_runs_best_file_is_its_parameters(tiny_checkpoint):
    run = tiny_checkpoint.parent
    assert tiny_checkpoint == run / "best.safetensors" and (run / "best.json").is_file()
    assert not list(run.glob("best*.pt")) and not list(run.glob("epoch_*.pt"))  # last.pt alone stays a .pt
    model = Translator.from_checkpoint(tiny_checkpoint, device="cpu").model
    assert tiny_checkpoint.stat().st_size <= 1.1 * unique_parameter_bytes(model)
    settings = json.loads((run / "best.json").read_text(encoding="utf-8"))
    assert settings["config"]["model"]["d_model"] == 64 and settings["text"]["mode"] == "word"
    assert "optimizer" not in settings and settings["train_state"]["step"] > 0


# ---------------------------------------------------------------- the round trip


def test_tied_weights_come_back_tied_and_the_outputs_are_the_saved_models(tmp_path):
    cfg = load_config("cpu_15min", ["model.d_model=64", "model.d_ff=128"])  # its switches, at a quarter of the width
    torch.manual_seed(0)
    model = build_model(cfg, 1000, 1000).eval()
    save_weights(weights_payload(cfg, model), tmp_path / "best.safetensors")
    loaded = load_checkpoint(tmp_path / "best.json")  # either file of the pair names it
    state = loaded["model"]
    assert list(state) == list(model.state_dict())  # every name, in the model's order
    assert state[TGT] is state[SRC] and state[GEN] is state[SRC]  # one tensor, three names
    assert loaded["config"] == config_to_dict(cfg) and loaded["train_state"] == {"epoch": 3, "step": 90}
    again = build_model(config_from_dict(loaded["config"]), 1000, 1000).eval()
    again.load_state_dict(state)
    lut = again.src_embed[0].lut.weight
    assert again.tgt_embed[0].lut.weight is lut and again.generator.proj.weight is lut  # the same storage
    torch.manual_seed(1)
    src, tgt = torch.randint(4, 1000, (2, 9)), torch.randint(4, 1000, (2, 7))
    assert torch.equal(logits(again, src, tgt), logits(model, src, tgt))


def test_a_subword_translator_round_trips_its_vocabulary_and_translations(spm_text, tmp_path):
    cfg = load_config("cpu_15min", ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2",
                                    "decode.max_len_a=4"])
    torch.manual_seed(0)
    model = build_model(cfg, len(spm_text.src_vocab), len(spm_text.tgt_vocab))
    before = Translator(model, spm_text, cfg, "cpu")
    weights, _ = save_weights(weights_payload(cfg, model, spm_text), tmp_path / "avg")
    after = Translator.from_checkpoint(weights, device="cpu")
    assert after.text == spm_text  # the SentencePiece model itself, from the JSON
    assert after.model.generator.proj.weight is after.model.src_embed[0].lut.weight
    sentences = ["Ein Hund läuft im Park.", "Ein Mann fährt schnell."]
    assert after.translate(sentences) == before.translate(sentences)


# ---------------------------------------------------------------- older files, and what names them


def test_an_old_pt_file_loads_and_translates_as_its_model_file(tiny_checkpoint, tmp_path):
    payload = load_checkpoint(tiny_checkpoint)
    old = tmp_path / "best.pt"
    # As the older version's trainer wrote it: torch.save of a dict, each name its own tensor.
    save_checkpoint(dict(payload, model={k: v.clone() for k, v in payload["model"].items()}), old)
    assert torch.load(old, weights_only=True)["format"] == "annotated-transformer/1"
    sentences = ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch."]
    from_pt = Translator.from_checkpoint(old, device="cpu")
    assert from_pt.checkpoint == old
    from_model_file = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    assert from_pt.translate(sentences) == from_model_file.translate(sentences)


def test_averaging_old_pt_files_of_a_tied_model_stores_the_matrix_once(tmp_path):
    cfg = load_config("cpu_15min", ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2"])
    torch.manual_seed(0)
    model = build_model(cfg, 300, 300)
    payload = weights_payload(cfg, model)
    copies = {k: v.clone() for k, v in payload["model"].items()}  # the older trainer's three copies
    save_checkpoint(dict(payload, model=copies), tmp_path / "epoch_09.pt")
    save_checkpoint(dict(payload, model={k: v + 1.0 for k, v in copies.items()}), tmp_path / "epoch_10.pt")
    assert average_checkpoints_into([str(tmp_path / "epoch_09.pt"), str(tmp_path / "epoch_10.pt")],
                                    str(tmp_path / "avg.pt")) == 0  # an older name for --out: the pair avg.*
    names, tied = stored(tmp_path / "avg.safetensors")
    assert tied == {TGT: SRC, GEN: SRC} and TGT not in names
    averaged = load_checkpoint(tmp_path / "avg.safetensors")["model"]
    torch.testing.assert_close(averaged[GEN], model.generator.proj.weight.detach() + 0.5, rtol=0, atol=1e-6)
    assert averaged[TGT] is averaged[SRC]


def test_what_names_a_model_file(tiny_checkpoint, tmp_path):
    run = tiny_checkpoint.parent
    assert resolve_checkpoint(run) == ("torch", tiny_checkpoint)  # a run directory: its best model file
    assert resolve_checkpoint(run / "best.json") == ("torch", tiny_checkpoint)
    assert resolve_checkpoint(run / "best.pt") == ("torch", tiny_checkpoint)  # the name older docs and scripts use
    assert load_checkpoint(run / "best.pt")["format"] == "annotated-transformer/weights/1"


def test_the_writer_writes_and_copies_the_pair_and_keeps_ties_in_last_pt(tmp_path):
    shared = torch.arange(12.0).reshape(3, 4)
    state = {"a": shared, "b": shared.detach(), "c": torch.ones(4)}  # a state_dict's detached view of a tie
    writer = CheckpointWriter()
    writer.save(({"model": state, "config": {}, "text": None}, [tmp_path / "best.safetensors",
                                                                tmp_path / "epoch_01.safetensors"]),
                ({"model": state, "config": {}, "optimizer": {}}, [tmp_path / "last.pt"]))
    shared.zero_()  # training goes on while the bytes are written
    writer.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "best.safetensors", "epoch_01.json",
                                                          "epoch_01.safetensors", "last.pt"]
    for name in ("best", "epoch_01"):
        assert stored(tmp_path / f"{name}.safetensors") == ({"a", "c"}, {"b": "a"})
        loaded = load_checkpoint(tmp_path / f"{name}.safetensors")["model"]
        assert loaded["b"] is loaded["a"] and torch.equal(loaded["a"], torch.arange(12.0).reshape(3, 4))
    last = load_checkpoint(tmp_path / "last.pt")["model"]
    assert last["a"].data_ptr() == last["b"].data_ptr()  # last.pt holds the tied matrix once too


# ---------------------------------------------------------------- a damaged model file: one line


def damage(weights: Path, how: str) -> None:
    """Break a copied model file pair the way a failed copy, a disk or a hand would."""
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif how == "a flipped byte":
        weights.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif how == "not safetensors":
        weights.write_bytes(b"PK\x03\x04 a zip, not a model file")
    elif how == "no json":
        weights.with_suffix(".json").unlink()
    elif how == "no safetensors":
        weights.unlink()
    elif how == "another json":
        weights.with_suffix(".json").write_text('{"itos": ["<unk>", "<pad>"]}')
        weights.unlink()


@pytest.mark.parametrize("how, message", [
    ("truncated", "is damaged or truncated"),
    ("a flipped byte", "its SHA-256 is not the one best.json records"),
    ("not safetensors", "is damaged or truncated"),
    ("no json", "best.json is missing: best.safetensors needs the JSON written beside it"),
    ("no safetensors", "best.safetensors is missing: best.json is the other half of a model file"),
    ("another json", "best.json is a JSON file, not a model file"),
])
def test_a_damaged_model_file_is_one_line(tiny_checkpoint, tmp_path, command, how, message):
    weights = tmp_path / "best.safetensors"
    for path in (tiny_checkpoint, tiny_checkpoint.with_suffix(".json")):
        shutil.copy(path, tmp_path / path.name)
    damage(weights, how)
    given = weights.with_suffix(".json") if how in ("no safetensors", "another json") else weights
    code, stdout, stderr = command("translate", "--checkpoint", given, "--device", "cpu", stdin=b"Ein Mann.\n")
    err = stderr.decode()
    assert code == 2 and stdout == b""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err and str(tmp_path) in err, err
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(given)
