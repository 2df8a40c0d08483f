"""Vocab and TextPipeline: specials, deterministic order, round trips, persistence (no dataset needed)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from annotated_transformer.data import BOS, EOS, PAD, SPECIALS, UNK, TextPipeline, Vocab
from annotated_transformer.data.tokenizers import word_tokenize, word_tokenize_many
from annotated_transformer.runtime.errors import ConfigError, DataError

GERMAN = ["Ein Mann fährt Fahrrad.", "Eine Frau fährt Auto.", "Ein Hund läuft  im Park.", "Ein Mann läuft."]
ENGLISH = ["A man rides a bike.", "A woman drives a car.", "A dog runs in the park.", "A man runs."]


# --------------------------------------------------------------------------- Vocab


def test_vocab_specials_frequency_order_and_min_freq():
    vocab = Vocab.build([["b", "a", "c"], ["a", "b", "d"], ["a", "<unk>", "e", "e"]], min_freq=2)
    # specials first at the notebook's ids; then by frequency, ties alphabetical; singletons dropped
    assert vocab.itos == [*SPECIALS, "a", "b", "e"]
    assert (vocab["<s>"], vocab["</s>"], vocab["<blank>"], vocab["<unk>"]) == (BOS, EOS, PAD, UNK) == (0, 1, 2, 3)
    assert vocab["c"] == UNK and vocab["never seen"] == UNK
    assert len(vocab) == 7
    assert Vocab.build([["x"]], min_freq=1).itos == [*SPECIALS, "x"]


def test_vocab_is_deterministic_and_round_trips():
    sents = [["z", "y", "x"], ["x", "y"], ["y"]] * 3
    v1, v2 = Vocab.build(sents, 1), Vocab.build(list(reversed(sents)), 1)
    assert v1 == v2 and v1.itos[4:] == ["y", "x", "z"]
    ids = v1.lookup_indices(["x", "y", "unknown"])
    assert ids == [5, 4, UNK]
    assert v1.lookup_tokens(ids) == ["x", "y", "<unk>"]
    assert v1.lookup_tokens(torch.tensor([5, 4])) == ["x", "y"]
    assert Vocab.from_dict(json.loads(json.dumps(v1.to_dict()))) == v1
    with pytest.raises(ValueError, match="a vocabulary must start with the specials"):
        Vocab(["a", "b"])  # no specials


# --------------------------------------------------------------------------- word mode


def word_pipeline(**kw) -> TextPipeline:
    src = word_tokenize_many(GERMAN, "de", kw.get("lowercase", False))
    tgt = word_tokenize_many(ENGLISH, "en", kw.get("lowercase", False))
    return TextPipeline.for_words(src, tgt, src_lang="de", tgt_lang="en", min_freq=1, **kw)


def test_word_tokenize_matches_batched_and_drops_whitespace():
    assert word_tokenize("Ein Hund läuft  im Park.", "de") == ["Ein", "Hund", "läuft", "im", "Park", "."]
    assert word_tokenize_many(GERMAN, "de") == [word_tokenize(s, "de") for s in GERMAN]
    assert word_tokenize("Ein Mann.", "de", lowercase=True) == ["ein", "mann", "."]


def test_word_encode_decode_round_trip():
    text = word_pipeline()
    ids = text.text_to_ids("Ein Mann fährt Auto.", "src")
    assert ids[0] == BOS and ids[-1] == EOS and UNK not in ids
    assert text.ids_to_text(ids, "src") == "Ein Mann fährt Auto ."
    assert text.ids_to_tokens(ids, "src") == ["Ein", "Mann", "fährt", "Auto", "."]
    # <blank> dropped, everything after </s> ignored, unknown words become <unk>
    tgt = text.text_to_ids("A man rides a zebra.", "tgt")
    assert text.ids_to_text([*tgt, PAD, PAD] + text.text_to_ids("dog", "tgt"), "tgt") == "A man rides a <unk> ."
    assert text.ids_to_text(torch.tensor(tgt), "tgt") == "A man rides a <unk> ."
    assert not text.shared_vocab and text.pad_id == PAD and text.bos_id == BOS


def test_encode_truncates_keeping_eos():
    text = word_pipeline(max_sentence_len=5)
    ids = text.text_to_ids("Ein Mann fährt Fahrrad im Park .", "src")
    assert len(ids) == 5 and ids[0] == BOS and ids[-1] == EOS
    assert text.ids_to_text(ids, "src") == "Ein Mann fährt"
    state = text.state_dict()
    state["max_len"] = state.pop("max_sentence_len")  # as a pipeline saved before 2026-11-25 holds it
    assert TextPipeline.from_state_dict(state).max_sentence_len == 5


def test_lowercase_mode():
    text = word_pipeline(lowercase=True)
    assert "Mann" not in text.src_vocab and "mann" in text.src_vocab
    assert text.ids_to_text(text.text_to_ids("EIN MANN", "src"), "src") == "ein mann"


def test_word_state_dict_is_weights_only_safe_and_round_trips(tmp_path, weights_only_roundtrip):
    text = word_pipeline()
    restored = TextPipeline.from_state_dict(weights_only_roundtrip(text.state_dict()))
    assert restored == text
    text.save(tmp_path / "vocab")
    names = sorted(p.name for p in (tmp_path / "vocab").iterdir())
    assert names == ["text_pipeline.json", "vocab.src.json", "vocab.tgt.json"]
    loaded = TextPipeline.load(tmp_path / "vocab")
    assert loaded == text
    assert loaded.text_to_ids("Ein Hund.", "src") == text.text_to_ids("Ein Hund.", "src")


def test_load_missing_or_damaged_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="text_pipeline.json is missing"):
        TextPipeline.load(tmp_path)
    text = word_pipeline()
    text.save(tmp_path)
    (tmp_path / "vocab.src.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match="damaged"):
        TextPipeline.load(tmp_path)


# --------------------------------------------------------------------------- spm mode


@pytest.fixture(scope="module")
def spm_pipeline() -> TextPipeline:
    # A small synthetic corpus keeps SentencePiece training under a second.
    words_de = ["Mann", "Frau", "Hund", "Katze", "fährt", "läuft", "springt", "Park", "Straße", "schnell"]
    words_en = ["man", "woman", "dog", "cat", "rides", "runs", "jumps", "park", "street", "quickly"]
    de = [f"Ein {words_de[i % 10]} {words_de[(i * 3) % 10]} im {words_de[(i * 7) % 10]}." for i in range(400)]
    en = [f"A {words_en[i % 10]} {words_en[(i * 3) % 10]} in the {words_en[(i * 7) % 10]}." for i in range(400)]
    return TextPipeline.for_subwords(de, en, src_lang="de", tgt_lang="en", vocab_size=50, max_sentence_len=32)


def test_spm_shared_vocab_and_specials(spm_pipeline):
    text = spm_pipeline
    assert text.mode == "spm" and text.shared_vocab and text.src_vocab is text.tgt_vocab
    assert len(text.src_vocab) == 50
    assert text.src_vocab.itos[:4] == list(SPECIALS)
    pieces = text.tokenize("Ein Hund läuft im Park.", "src")
    assert pieces and all(isinstance(p, str) for p in pieces)


def test_spm_detokenises_exactly(spm_pipeline):
    text = spm_pipeline
    for sentence in ["Ein Hund läuft im Park.", "A cat jumps in the street."]:
        ids = text.text_to_ids(sentence, "src")
        assert ids[0] == BOS and ids[-1] == EOS
        assert text.ids_to_text(ids, "tgt") == sentence
        assert "".join(text.ids_to_tokens(ids)).replace("\u2581", " ").strip() == sentence


def test_spm_state_dict_round_trip(spm_pipeline, tmp_path, weights_only_roundtrip):
    state = spm_pipeline.state_dict()
    assert isinstance(state["spm_model"], torch.Tensor) and state["spm_model"].dtype == torch.uint8
    restored = TextPipeline.from_state_dict(weights_only_roundtrip(state))
    assert restored == spm_pipeline
    spm_pipeline.save(tmp_path)
    assert {"spm.model", "spm.vocab", "text_pipeline.json"} <= {p.name for p in tmp_path.iterdir()}
    loaded = TextPipeline.load(tmp_path)
    assert loaded.text_to_ids("Ein Mann fährt.", "src") == spm_pipeline.text_to_ids("Ein Mann fährt.", "src")


def test_a_spm_vocabulary_too_large_or_too_small_is_one_line_naming_our_key():
    """The size SentencePiece can make, in data.spm_vocab_size's terms (its own advice named --character_coverage,
    which is no option here)."""
    with pytest.raises(ConfigError) as large:
        TextPipeline.for_subwords(["ein Hund"] * 20, ["a dog"] * 20, src_lang="de", tgt_lang="en", vocab_size=5000)
    assert re.fullmatch(r"data\.spm_vocab_size=5000 is more pieces than the training text holds \(at most (\d+)\); "
                        r"lower data\.spm_vocab_size to \1 or less", str(large.value)), str(large.value)
    with pytest.raises(ConfigError) as small:
        TextPipeline.for_subwords(["ein Hund"] * 20, ["a dog"] * 20, src_lang="de", tgt_lang="en", vocab_size=5)
    said = str(small.value)
    assert re.fullmatch(r"data\.spm_vocab_size=5 is smaller than the training text's distinct characters and special "
                        r"tokens \((\d+)\); raise data\.spm_vocab_size to \1 or more", said), said
    assert "character_coverage" not in said


# --------------------------------------------------------------------------- damaged tokenizer files: one line each


def _edit_settings(**changes):
    """A damage: text_pipeline.json with `changes` applied."""
    def edit(folder):
        path = folder / "text_pipeline.json"
        settings = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**settings, **changes}), encoding="utf-8")
    return edit


def _write(name: str, data: bytes):
    """A damage: `name` in the folder holds `data`."""
    return lambda folder: (folder / name).write_bytes(data)


@pytest.mark.parametrize("damage, name, reason", [
    (_write("text_pipeline.json", b"[1, 2]"), "text_pipeline.json", "a JSON list, not an object of settings"),
    (_write("text_pipeline.json", b'{"format": 1, "mo'), "text_pipeline.json", "not valid JSON: "),
    (_edit_settings(mode="bpe"), "text_pipeline.json", "mode 'bpe' is not one of word, spm"),
    (_edit_settings(max_sentence_len="long"), "text_pipeline.json", "max_sentence_len is 'long'"),
    (_edit_settings(src_vocab_file="../../secret.json"), "text_pipeline.json",
     "src_vocab_file is '../../secret.json', not a file name"),
    (_write("vocab.tgt.json", b'{"itos": ["a", "b"]}'), "vocab.tgt.json", "a vocabulary must start with the specials"),
    (_write("vocab.src.json", b'["<s>", "</s>"]'), "vocab.src.json", "not an object whose 'itos' lists the tokens"),
    (_write("vocab.src.json", b"\xff\xfe\x00"), "vocab.src.json", "not valid JSON: "),
    (lambda folder: (folder / "vocab.tgt.json").unlink(), "vocab.tgt.json", None),
])
def test_a_damaged_word_mode_file_is_one_line_naming_it(tmp_path, damage, name, reason):
    word_pipeline().save(tmp_path / "vocab")
    damage(tmp_path / "vocab")
    with pytest.raises(DataError) as raised:
        TextPipeline.load(tmp_path / "vocab")
    message = str(raised.value)
    problem = "is missing" if reason is None else f"is damaged ({reason}"
    assert message.startswith(f"{tmp_path / 'vocab' / name} {problem}"), message
    assert "copy its folder again" in message and "model file, which carries its tokenizer" in message
    assert "\n" not in message


def test_a_damaged_sentencepiece_model_is_one_line_naming_it(spm_pipeline, tmp_path):
    spm_pipeline.save(tmp_path)
    model = (tmp_path / "spm.model").read_bytes()
    for data in (model[: len(model) // 2], b"not a model at all"):
        (tmp_path / "spm.model").write_bytes(data)
        with pytest.raises(DataError, match=rf"^{tmp_path / 'spm.model'} is damaged \(not a SentencePiece model "
                                            rf"\({len(data)} bytes\)\); copy its folder again"):
            TextPipeline.load(tmp_path)


def test_an_unreadable_tokenizer_file_is_not_called_damaged(tmp_path, monkeypatch):
    from pathlib import Path

    word_pipeline().save(tmp_path)
    read_bytes = Path.read_bytes

    def denied(path):
        if path.name == "vocab.src.json":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(DataError, match=rf"^cannot read {tmp_path / 'vocab.src.json'} \(Permission denied\); "
                                        "check its permissions and the disk$"):
        TextPipeline.load(tmp_path)


def test_translating_with_an_exported_folder_whose_vocab_is_damaged_is_one_line(tmp_path, command):
    pytest.importorskip("ctranslate2")
    from annotated_transformer.config import config_yaml, load_config

    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"")  # never read: the vocabulary is checked first
    (folder / "config.yaml").write_text(config_yaml(load_config("tiny")), encoding="utf-8")
    word_pipeline().save(folder / "vocab")
    (folder / "vocab" / "text_pipeline.json").write_text("[]", encoding="utf-8")
    code, out, err = command("translate", "--checkpoint", str(folder), stdin=b"Ein Mann.\n")
    assert code == 2 and out == b"", err
    assert err.decode().splitlines() == [f"error: {folder / 'vocab' / 'text_pipeline.json'} is damaged (a JSON list, "
                                         "not an object of settings); copy its folder again from where it was written "
                                         "(a run's or an exported model's vocab/), or use the model file, which "
                                         "carries its tokenizer"]
