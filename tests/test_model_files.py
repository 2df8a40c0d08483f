"""The model file a user ships (one NAME.safetensors: weights, config and vocabulary): its size, tied weights stored
once and tied again on load, the same outputs after a round trip, the older formats (a .safetensors + .json pair, .pt
files) still loading, averaging into one file, and one line for a damaged or crafted file."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from annotated_transformer.checkpoints import (CheckpointWriter, average_into, load_checkpoint, model_file,
                                               save_checkpoint, save_model_file)
from annotated_transformer.config import config_from_dict, config_to_dict, load_config
from annotated_transformer.data.text import TextPipeline
from annotated_transformer.deploy.translator import Translator, resolve_checkpoint
from annotated_transformer.extensions.builder import build_model
from annotated_transformer.harness.run_dir import RunDir
from annotated_transformer.masks import subsequent_mask
from annotated_transformer.runtime import files
from annotated_transformer.runtime.errors import CheckpointError, ConfigError, UserError

SRC, TGT, GEN = "src_embed.0.lut.weight", "tgt_embed.0.lut.weight", "generator.proj.weight"
CPU_15MIN_VOCAB = 8000  # cpu_15min.yaml's data.spm_vocab_size: one vocabulary, tied embeddings
SENTENCES = ["Ein Mann fährt Fahrrad.", "Eine Frau liest ein Buch."]


def unique_parameter_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's parameters, a tied matrix counted once, at their dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weights_payload(cfg, model: torch.nn.Module, text: TextPipeline | None = None) -> dict:
    """What training writes to its best model file."""
    return {"config": config_to_dict(cfg), "model": model.state_dict(),
            "text": None if text is None else text.state_dict(), "train_state": {"epoch": 3, "step": 90}}


def metadata(path: Path) -> dict[str, str]:
    """A .safetensors file's metadata (str -> str)."""
    with safe_open(path, framework="pt") as f:
        return f.metadata()


def stored(path: Path) -> tuple[set[str], dict[str, str]]:
    """The tensor names a .safetensors file holds, and the tied names its metadata records."""
    with safe_open(path, framework="pt") as f:
        return set(f.keys()), json.loads(f.metadata()["tied"])


def data_start(raw: bytes) -> int:
    """Where a safetensors file's tensor data starts: after the 8-byte length and the JSON header."""
    return 8 + int.from_bytes(raw[:8], "little")


def logits(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The generator's log-probabilities for teacher-forced `tgt` after `src` (no padding)."""
    with torch.no_grad():
        out = model(src, tgt, torch.ones(src.shape[0], 1, src.shape[1], dtype=torch.bool),
                    subsequent_mask(tgt.shape[1]))
        return model.generator(out)


def write_old_pair(payload: dict, stem: Path) -> Path:
    """The model file pair an older version wrote, NAME.safetensors + NAME.json, as its writer wrote it: the tensors
    (a tied one once) with only format, tied and order in the metadata; the config, vocabulary and counters in the
    JSON with the SHA-256 of the whole .safetensors. Returns the .safetensors."""
    state = payload["model"]
    first: dict[tuple, str] = {}
    ties = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in first:
            ties[name] = first[key]
        else:
            first[key] = name
    tensors = {name: t.detach().contiguous().clone() for name, t in state.items() if name not in ties}
    data = safetensors.torch.save(tensors, {"format": "annotated-transformer/weights/1", "tied": json.dumps(ties),
                                            "order": json.dumps(list(state))})
    text = payload.get("text")
    if text is not None and text.get("spm_model") is not None:
        text = {**text, "spm_model": base64.b64encode(text["spm_model"].numpy().tobytes()).decode("ascii")}
    doc = {"format": "annotated-transformer/weights/1", "sha256": hashlib.sha256(data).hexdigest(),
           "config": payload["config"], "text": text, "train_state": payload.get("train_state", {})}
    weights = stem.with_name(stem.name + ".safetensors")
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(data)
    weights.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return weights


def recraft(path: Path, **entries: str | None) -> None:
    """Rewrite a model file with some metadata entries changed (None: removed) and its SHA-256 made right again: a
    file crafted by hand, not damaged on the way."""
    with safe_open(path, framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = dict(f.metadata())
    meta.update({k: v for k, v in entries.items() if v is not None})
    meta = {k: v for k, v in meta.items() if entries.get(k, "") is not None and k != "sha256"}
    raw = safetensors.torch.save(tensors, meta)  # the data's layout does not depend on the metadata
    digest = hashlib.sha256(raw[data_start(raw):]).hexdigest()
    path.write_bytes(safetensors.torch.save(tensors, {**meta, "sha256": digest}))


def one_line(command, given: Path, message: str, tmp_path: Path) -> None:
    """translate --checkpoint `given` fails with one line holding `message` and the folder; load_checkpoint alike."""
    code, stdout, stderr = command("translate", "--checkpoint", given, "--device", "cpu", stdin=b"Ein Mann.\n")
    err = stderr.decode()
    assert code == 2 and stdout == b""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err and str(tmp_path) in err, err
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(given)
    assert message in str(exc.value)


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


# ---------------------------------------------------------------- one file: the unique parameters once, all inside


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_15min_model_file_is_its_unique_parameters_once(cpu_15min_model, dtype, tmp_path):
    cfg, model = cpu_15min_model
    model = copy.deepcopy(model).to(dtype)  # deepcopy keeps the tie
    assert model.num_parameters() > 7_500_000  # the shape of cpu_15min's 7.6M parameters
    weights = save_model_file(weights_payload(cfg, model), tmp_path / "best")
    assert weights == tmp_path / "best.safetensors" and sorted(os.listdir(tmp_path)) == ["best.safetensors"]
    size = weights.stat().st_size
    assert size <= 1.1 * unique_parameter_bytes(model), (size, unique_parameter_bytes(model))
    names, tied = stored(weights)
    assert SRC in names and TGT not in names and GEN not in names
    assert tied == {TGT: SRC, GEN: SRC}


def test_a_model_file_is_one_file_holding_its_config_vocabulary_and_checksum(tiny_checkpoint):
    run = tiny_checkpoint.parent
    assert tiny_checkpoint == run / "best.safetensors"
    assert not list(run.glob("*.json")) and not list(run.glob("best*.pt")) and not list(run.glob("epoch_*.pt"))
    model = Translator.from_checkpoint(tiny_checkpoint, device="cpu").model
    assert tiny_checkpoint.stat().st_size <= 1.1 * unique_parameter_bytes(model)
    meta = metadata(tiny_checkpoint)
    assert meta["format"] == "annotated-transformer/model/1"
    assert json.loads(meta["config"])["model"]["d_model"] == 64 and json.loads(meta["text"])["mode"] == "word"
    assert json.loads(meta["train_state"])["step"] > 0 and "optimizer" not in meta
    raw = tiny_checkpoint.read_bytes()
    assert meta["sha256"] == hashlib.sha256(raw[data_start(raw):]).hexdigest()  # of the tensor data


def test_a_failed_write_leaves_the_old_model_file_whole(tiny_checkpoint, tmp_path, monkeypatch):
    target = tmp_path / "best.safetensors"
    shutil.copy(tiny_checkpoint, target)
    before = target.read_bytes()
    payload = load_checkpoint(tiny_checkpoint)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)  # the bytes never reach the disk
    with pytest.raises(OSError):
        save_model_file(dict(payload, train_state={"epoch": 9}), target)
    monkeypatch.undo()
    assert target.read_bytes() == before and os.listdir(tmp_path) == ["best.safetensors"]  # no temporary left
    assert load_checkpoint(target)["train_state"] == payload["train_state"]


# ---------------------------------------------------------------- the round trip


def test_tied_weights_come_back_tied_and_the_outputs_are_the_saved_models(tmp_path):
    cfg = load_config("cpu_15min", ["model.d_model=64", "model.d_ff=128"])  # its switches, at a quarter of the width
    torch.manual_seed(0)
    model = build_model(cfg, 1000, 1000).eval()
    save_model_file(weights_payload(cfg, model), tmp_path / "best.safetensors")
    loaded = load_checkpoint(tmp_path / "best.safetensors")
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
    weights = save_model_file(weights_payload(cfg, model, spm_text), tmp_path / "avg")
    assert sorted(os.listdir(tmp_path)) == ["avg.safetensors"]
    after = Translator.from_checkpoint(weights, device="cpu")
    assert after.text == spm_text  # the SentencePiece model itself, from the file's metadata
    assert after.model.generator.proj.weight is after.model.src_embed[0].lut.weight
    sentences = ["Ein Hund läuft im Park.", "Ein Mann fährt schnell."]
    assert after.translate(sentences) == before.translate(sentences)


# ---------------------------------------------------------------- older files, and what names them


def test_an_old_model_file_pair_loads_and_translates_as_it_did(tiny_checkpoint, spm_text, tmp_path):
    payload = load_checkpoint(tiny_checkpoint)
    run = tmp_path / "old_run"
    old = write_old_pair(payload, run / "best")
    assert "config" not in metadata(old)  # the config is in best.json alone
    translator = Translator.from_checkpoint(old, device="cpu")
    assert translator.translate(SENTENCES) == Translator.from_checkpoint(tiny_checkpoint, "cpu").translate(SENTENCES)
    for given in (run / "best.json", run):  # the .json beside it, or the run directory, names it too
        assert resolve_checkpoint(given) == ("torch", old)
    loaded = load_checkpoint(old)
    assert loaded["format"] == "annotated-transformer/weights/1" and loaded["config"] == payload["config"]
    assert list(loaded["model"]) == list(payload["model"])
    assert all(torch.equal(loaded["model"][k], v) for k, v in payload["model"].items())
    cfg = load_config("cpu_15min", ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2"])
    torch.manual_seed(0)
    model = build_model(cfg, len(spm_text.src_vocab), len(spm_text.tgt_vocab))
    subword = write_old_pair(weights_payload(cfg, model, spm_text), tmp_path / "spm")  # its SentencePiece in base64
    assert Translator.from_checkpoint(subword, device="cpu").text == spm_text


def test_an_old_pt_file_loads_and_translates_as_its_model_file(tiny_checkpoint, tmp_path):
    payload = load_checkpoint(tiny_checkpoint)
    old = tmp_path / "best.pt"
    # As the older version's trainer wrote it: torch.save of a dict, each name its own tensor.
    save_checkpoint(dict(payload, model={k: v.clone() for k, v in payload["model"].items()}), old)
    assert torch.load(old, weights_only=True)["format"] == "annotated-transformer/1"
    from_pt = Translator.from_checkpoint(old, device="cpu")
    assert from_pt.checkpoint == old
    from_model_file = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    assert from_pt.translate(SENTENCES) == from_model_file.translate(SENTENCES)
    assert model_file(tmp_path / "best.safetensors") == old  # the run's best, as an older version kept it
    assert resolve_checkpoint(tmp_path) == ("torch", old)  # a run directory of an older version


def test_averaging_old_pt_files_of_a_tied_model_stores_the_matrix_once(tmp_path):
    cfg = load_config("cpu_15min", ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=2"])
    torch.manual_seed(0)
    model = build_model(cfg, 300, 300)
    payload = weights_payload(cfg, model)
    copies = {k: v.clone() for k, v in payload["model"].items()}  # the older trainer's three copies
    save_checkpoint(dict(payload, model=copies), tmp_path / "epoch_09.pt")
    save_checkpoint(dict(payload, model={k: v + 1.0 for k, v in copies.items()}), tmp_path / "epoch_10.pt")
    out = average_into([tmp_path / "epoch_09.pt", tmp_path / "epoch_10.pt"], tmp_path / "avg.pt")
    assert out == tmp_path / "avg.safetensors" and not (tmp_path / "avg.json").exists()  # an older name for --out
    names, tied = stored(out)
    assert tied == {TGT: SRC, GEN: SRC} and TGT not in names
    loaded = load_checkpoint(out)
    averaged = loaded["model"]
    torch.testing.assert_close(averaged[GEN], model.generator.proj.weight.detach() + 0.5, rtol=0, atol=1e-6)
    assert averaged[TGT] is averaged[SRC]
    assert loaded["averaged_from"] == [str(tmp_path / "epoch_09.pt"), str(tmp_path / "epoch_10.pt")]


def test_what_names_a_model_file(tiny_checkpoint, tmp_path):
    run = tiny_checkpoint.parent
    assert resolve_checkpoint(run) == ("torch", tiny_checkpoint)  # a run directory: its best model file
    assert resolve_checkpoint(run / "best.json") == ("torch", tiny_checkpoint)  # an older pair's name for it
    assert resolve_checkpoint(run / "best.pt") == ("torch", tiny_checkpoint)  # the name older docs and scripts use
    assert load_checkpoint(run / "best.pt")["format"] == "annotated-transformer/model/1"
    assert model_file(run / "last.pt") == run / "last.pt"


def test_the_writer_writes_and_copies_one_file_and_keeps_ties_in_last_pt(tmp_path):
    shared = torch.arange(12.0).reshape(3, 4)
    state = {"a": shared, "b": shared.detach(), "c": torch.ones(4)}  # a state_dict's detached view of a tie
    writer = CheckpointWriter()
    writer.save(({"model": state, "config": {}, "text": None}, [tmp_path / "best.safetensors",
                                                                tmp_path / "epoch_01.safetensors"]),
                ({"model": state, "config": {}, "optimizer": {}}, [tmp_path / "last.pt"]))
    shared.zero_()  # training goes on while the bytes are written
    writer.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.safetensors", "epoch_01.safetensors", "last.pt"]
    for name in ("best", "epoch_01"):
        assert stored(tmp_path / f"{name}.safetensors") == ({"a", "c"}, {"b": "a"})
        loaded = load_checkpoint(tmp_path / f"{name}.safetensors")["model"]
        assert loaded["b"] is loaded["a"] and torch.equal(loaded["a"], torch.arange(12.0).reshape(3, 4))
    last = load_checkpoint(tmp_path / "last.pt")["model"]
    assert last["a"].data_ptr() == last["b"].data_ptr()  # last.pt holds the tied matrix once too


def test_pruning_an_epoch_removes_its_model_file_and_an_older_json_beside_it(tiny_checkpoint, tmp_path):
    run = RunDir(tmp_path)
    payload = load_checkpoint(tiny_checkpoint)
    write_old_pair(payload, tmp_path / "epoch_01")  # written by an older version, before a resume
    save_model_file(payload, run.epoch(2))
    save_model_file(payload, run.epoch(3))
    assert [e for e, _ in run.epoch_files()] == [1, 2, 3]
    run.prune_epochs(keep_after=2)
    assert sorted(os.listdir(tmp_path)) == ["epoch_03.safetensors"]


# ---------------------------------------------------------------- average-checkpoints: one file, never over a user's


def test_average_checkpoints_replaces_an_existing_out_only_with_overwrite(tiny_checkpoint, tmp_path, command):
    out = tmp_path / "avg.safetensors"
    out.write_bytes(b"the user's own file")
    code, stdout, stderr = command("average-checkpoints", tiny_checkpoint, "--out", out)
    err = stderr.decode()
    assert code == 2 and stdout == b"" and err.count("\n") == 1
    assert f"{out} already exists" in err and "--overwrite" in err
    assert out.read_bytes() == b"the user's own file"
    code, stdout, stderr = command("average-checkpoints", tiny_checkpoint, "--out", out, "--overwrite")
    assert code == 0, stderr.decode()
    assert stdout.decode() == f"averaged 1 checkpoint into {out} (config and vocabulary inside)\n"
    assert sorted(os.listdir(tmp_path)) == ["avg.safetensors"]
    assert Translator.from_checkpoint(out, device="cpu").translate(SENTENCES) == \
        Translator.from_checkpoint(tiny_checkpoint, device="cpu").translate(SENTENCES)


@pytest.mark.parametrize("out, message", [
    ("{run}/best.safetensors", "is a file of the run or export in"),  # the command: never a run's own file
    ("{run}/best.pt", "is a file of the run or export in"),  # the same file, by the name older scripts use
    ("{tmp}/avg.json", "a model file is one .safetensors file, its config and vocabulary inside; name it"),
    ("{tmp}/avg.bin", "--out should be a .safetensors file"),
    ("{tmp}", "is a folder; give the path of the model file to write"),  # it wrote {tmp}.safetensors beside it
    ("{tmp}/new/", "is a folder; give the path of the model file to write"),
])
def test_average_checkpoints_refuses_a_bad_out_in_one_line(tiny_checkpoint, tmp_path, command, out, message):
    run = tiny_checkpoint.parent
    before = tiny_checkpoint.read_bytes()
    out = out.format(run=run, tmp=tmp_path)
    code, stdout, stderr = command("average-checkpoints", tiny_checkpoint, tiny_checkpoint, "--out", out,
                                   "--overwrite")
    err = stderr.decode()
    assert code == 2 and stdout == b"" and err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert tiny_checkpoint.read_bytes() == before and os.listdir(tmp_path) == []
    if message.startswith("is a file of the run"):  # the API: never the file it reads
        message = "is one of the checkpoints to average"
    with pytest.raises((ConfigError, UserError), match=re.escape(message.split(";")[0])):
        average_into([tiny_checkpoint], out, overwrite=True)


# ---------------------------------------------------------------- a damaged or crafted model file: one line


def damage(weights: Path, how: str) -> None:
    """Break a copied model file the way a failed copy, a disk or a hand would."""
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    elif how == "a flipped byte":
        weights.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif how == "not safetensors":
        weights.write_bytes(b"PK\x03\x04 a zip, not a model file")
    elif how == "empty":
        weights.write_bytes(b"")
    elif how == "a header that is not JSON":
        weights.write_bytes((16).to_bytes(8, "little") + b"{not json at all" + data[8:])
    elif how == "another program's safetensors":
        weights.write_bytes(safetensors.torch.save({"w": torch.zeros(2)}, {"framework": "pt"}))
    elif how == "tied is a list":
        recraft(weights, tied='["a", "b"]')
    elif how == "a tied name without its tensor":
        recraft(weights, tied=json.dumps({"x.weight": "no.such.tensor"}))
    elif how == "order is a mapping":
        recraft(weights, order="{}")
    elif how == "no config":
        recraft(weights, config=None)
    elif how == "a config that is not JSON":
        recraft(weights, config="{'model': 1")
    elif how == "a config that is a list":
        recraft(weights, config="[1, 2]")
    elif how == "a text that is a list":
        recraft(weights, text='["<unk>"]')
    elif how == "a SentencePiece model that is not base64":
        text = json.loads(metadata(weights)["text"])
        recraft(weights, text=json.dumps({**text, "mode": "spm", "spm_model": "not base64 at all!"}))
    elif how == "a train_state that is a string":
        recraft(weights, train_state='"epoch 3"')


@pytest.mark.parametrize("how, message", [
    ("truncated", "best.safetensors is damaged or truncated"),
    ("a flipped byte", "its tensor data does not match the SHA-256 its metadata records"),
    ("not safetensors", "best.safetensors is damaged or truncated (its header claims"),
    ("empty", "shorter than a safetensors header"),
    ("a header that is not JSON", "its header is not JSON"),
    ("another program's safetensors", "is a safetensors file but not an annotated-transformer model file"),
    ("tied is a list", "its metadata's 'tied' is a list, not a mapping of names"),
    ("a tied name without its tensor", "the tied name no.such.tensor has no tensor"),
    ("order is a mapping", "its metadata's 'order' is not a list of names"),
    ("no config", "best.safetensors's metadata is damaged or was not written by training (it holds no config)"),
    ("a config that is not JSON", "its metadata's 'config' is not JSON"),
    ("a config that is a list", "its config is a list, not a mapping"),
    ("a text that is a list", "its text is a list, not a mapping or null"),
    ("a SentencePiece model that is not base64", "its SentencePiece model is not base64"),
    ("a train_state that is a string", "its train_state is a str, not a mapping"),
])
def test_a_damaged_or_crafted_model_file_is_one_line(tiny_checkpoint, tmp_path, command, how, message):
    weights = tmp_path / "best.safetensors"
    shutil.copy(tiny_checkpoint, weights)
    damage(weights, how)
    one_line(command, weights, message, tmp_path)


def damage_pair(weights: Path, how: str) -> Path:
    """Break an older model file pair; returns the file to pass (the .safetensors, or the .json where it is gone)."""
    settings = weights.with_suffix(".json")
    data = weights.read_bytes()
    if how == "a flipped byte":
        weights.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif how == "no json":
        settings.unlink()
    elif how == "a json that is a list":
        settings.write_text('[{"format": "annotated-transformer/weights/1"}]')
    elif how == "a json without config":
        doc = json.loads(settings.read_text())
        del doc["config"]
        settings.write_text(json.dumps(doc))
    elif how == "a json that is not JSON":
        settings.write_text('{"format": "annotated-transformer/weights/1", "config": ')
    elif how in ("no safetensors", "another json"):
        weights.unlink()
        if how == "another json":
            settings.write_text('{"itos": ["<unk>", "<pad>"]}')
        return settings
    return weights


@pytest.mark.parametrize("how, message", [
    ("a flipped byte", "its SHA-256 is not the one best.json records"),
    ("no json", "best.json is missing: best.safetensors is an older model file whose config and vocabulary are in "
                "the JSON written beside it"),
    ("a json that is a list", "best.json is not the JSON of a model file"),
    ("a json without config", "best.json is damaged or was not written by training (it holds no config)"),
    ("a json that is not JSON", "best.json is unreadable"),
    ("no safetensors", "best.safetensors is missing: best.json is the other half of an older model file"),
    ("another json", "best.json is a JSON file, not a model file"),
])
def test_a_damaged_old_pair_is_one_line(tiny_checkpoint, tmp_path, command, how, message):
    weights = write_old_pair(load_checkpoint(tiny_checkpoint), tmp_path / "best")
    one_line(command, damage_pair(weights, how), message, tmp_path)
