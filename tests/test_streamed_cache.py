"""The data cache at scale: files streamed in chunks, ids in flat memory-mapped .npy files (format 2),
SentencePiece on a sample of a large training split, and the same ids as tokenising everything at once."""

from __future__ import annotations

import gzip
import hashlib
import json
import mmap
import random
from pathlib import Path

import numpy as np
import pytest

from annotated_transformer.config import load_config
from annotated_transformer.data import load_translation_data, open_corpus
from annotated_transformer.data import tokenise
from annotated_transformer.data.cache import CACHE_FORMAT, MANIFEST, ids_files, read_cache
from annotated_transformer.data.ids import RaggedIds
from annotated_transformer.data.own_files import (FileFacts, check_file, file_chunks, picked_lines, read_file,
                                                   split_lines)
from annotated_transformer.data.text import TextPipeline, truncate_ids
from annotated_transformer.data.tokenizers import word_tokenize_many
from annotated_transformer.data.cache import corpus_settings
from annotated_transformer.data.translation_data import TextLines, apply_long_policy, data_fingerprint
from annotated_transformer.runtime.errors import ConfigError, DataError

# Two made-up languages, word by word, with accents, capitals and punctuation for the tokenizers to see.
DE = ["Hund", "läuft", "über", "die", "Straße", "Kinder", "spielen", "im", "Park", "ein", "Mann", "grüßt"]
EN = ["dog", "runs", "across", "the", "street", "children", "play", "in", "park", "a", "man", "greets"]


def pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` sentence pairs of 3-12 words, some of them ending with a full stop or a comma inside."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.randrange(len(DE)) for _ in range(rng.randint(3, 12))]
        end = rng.choice(["", ".", "!"])
        out.append((" ".join(DE[w] for w in words) + end, " ".join(EN[w] for w in words) + end))
    return out


def write(prefix: Path, rows: list[tuple[str, str]], gz: bool = False) -> None:
    """PREFIX.de and PREFIX.en (gzip-compressed with `gz`)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang, side in (("de", 0), ("en", 1)):
        data = "".join(r[side] + "\n" for r in rows).encode("utf-8")
        name = prefix.with_name(f"{prefix.name}.{lang}" + (".gz" if gz else ""))
        name.write_bytes(gzip.compress(data) if gz else data)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A folder with train (3,000 pairs, gzip-compressed), val (200) and test (100) files."""
    folder = tmp_path_factory.mktemp("corpus")
    write(folder / "train", pairs(3000, 1), gz=True)
    write(folder / "val", pairs(200, 2))
    write(folder / "test", pairs(100, 3))
    return folder


def config(folder: Path, cache: Path, *overrides: str):
    """tiny.yaml on the corpus in `folder` (de -> en), SentencePiece with a small vocabulary."""
    return load_config("tiny", ["data.dataset=files", f"data.train={folder / 'train'}", f"data.val={folder / 'val'}",
                                f"data.test={folder / 'test'}", f"data.cache_dir={cache}", "data.tokenizer=spm",
                                "data.spm_vocab_size=50", "model.tie_embeddings=false", *overrides])


def build(cfg, seed: int | None = None, **kwargs) -> Path:
    """`build_cache` of the config's corpus, under the settings a run computes (`seed`: SentencePiece's sample)."""
    corpus = open_corpus(cfg.data)
    return tokenise.build_cache(cfg.data, corpus, corpus_settings(cfg.data, corpus, seed), **kwargs)


def lines(folder: Path, name: str) -> list[str]:
    """A file's lines as the corpus reads them (plain or .gz)."""
    path = folder / name
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return split_lines(raw.decode("utf-8"))


def mapped(array: np.ndarray) -> bool:
    """Whether `array` is a view of a memory-mapped file (np.memmap, or a view whose base is one)."""
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            return True
        array = array.base
    return isinstance(array, mmap.mmap)


def as_lists(ids) -> list[list[int]]:
    return [ids[i].tolist() for i in range(len(ids))]


# --------------------------------------------------------------------------- format 2 on disk and back


def test_the_cache_is_flat_npy_files_mapped_back_with_the_ids_of_tokenising_everything_at_once(corpus, tmp_path):
    data = load_translation_data(config(corpus, tmp_path / "cache"), log=None)
    folder = Path(data.stats["cache"])
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["settings"]["format"] == CACHE_FORMAT == 2 and "spm_sample" not in manifest["settings"]
    for split in ("train", "val", "test"):
        for side in ("src", "tgt"):
            ids_name, offsets_name = ids_files(split, side)
            flat, offsets = np.load(folder / ids_name, mmap_mode="r"), np.load(folder / offsets_name, mmap_mode="r")
            assert flat.dtype == np.uint16 and offsets.dtype == np.int64  # 50 pieces fit in 16 bits
            assert offsets[0] == 0 and offsets[-1] == flat.size and offsets.size == manifest["stats"]["raw_lines"][
                split] + 1
            assert ids_name in manifest["checksums"] and offsets_name in manifest["checksums"]
    # The reference: the text pipeline of the cache applied to every line at once, as the cache was built before.
    text = data.text
    for split, stem in (("train", "train"), ("val", "val"), ("test", "test")):
        for side, lang in (("src", "de"), ("tgt", "en")):
            raw = lines(corpus, f"{stem}.{lang}" + (".gz" if split == "train" else ""))
            assert as_lists(getattr(data.splits[split], side)) == text.ids_many(raw, side), (split, side)
    again, splits, _ = read_cache(folder)
    assert again == text and isinstance(splits["train"]["src"], RaggedIds) and mapped(splits["train"]["src"].flat)


def test_the_loaded_training_split_holds_no_object_per_sentence(corpus, tmp_path):
    data = load_translation_data(config(corpus, tmp_path / "cache", "data.max_sentence_len=10",
                                        "data.long_policy=skip"), log=None)
    train = data.splits["train"]
    for ids in (train.src, train.tgt):
        assert isinstance(ids, RaggedIds) and mapped(ids.flat)  # the ids stay in the file, paged in when read
        assert ids.limit == 10 and ids.rows is not None  # long_policy=skip's kept rows, no copy of the ids
    assert isinstance(train.src_text, TextLines) and isinstance(train.tgt_text, TextLines)  # not lists of str
    assert train.src_lens.max() <= 10 and len(train) == len(train.src_text) < 3000
    # The text streams from the files when asked for, the skipped pairs left out, aligned with the ids.
    src = lines(corpus, "train.de.gz")
    assert list(train.src_text) == [src[i] for i in train.src.rows]
    i = len(train) // 2
    assert train.src_text[i] == src[train.src.rows[i]] and train.tgt_text[-1] == lines(corpus, "train.en.gz")[
        train.tgt.rows[-1]]
    assert train.src_text[:3] == [src[r] for r in train.src.rows[:3]]
    assert train.src[i].tolist() == data.text.text_to_ids(train.src_text[i], "src")
    assert isinstance(data.splits["val"].src_text, list)  # val and test are small: kept


@pytest.mark.slow
def test_word_mode_streams_in_two_passes_with_the_vocabulary_and_ids_of_one(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenise, "REMAP_IDS", 1000)  # the second pass in many pieces
    cfg = config(corpus, tmp_path / "cache", "data.tokenizer=word", "data.min_freq=1")
    folder = build(cfg, chunk_bytes=4000)  # a dozen chunks a file
    text, splits, stats = read_cache(folder)
    src, tgt = lines(corpus, "train.de.gz"), lines(corpus, "train.en.gz")
    src_tokens, tgt_tokens = word_tokenize_many(src, "de"), word_tokenize_many(tgt, "en")
    reference = TextPipeline.for_words(src_tokens, tgt_tokens, src_lang="de", tgt_lang="en", min_freq=1)
    assert (text.src_vocab, text.tgt_vocab) == (reference.src_vocab, reference.tgt_vocab)
    assert as_lists(splits["train"]["src"]) == [reference.numericalize(t, "src") for t in src_tokens]
    assert as_lists(splits["train"]["tgt"]) == [reference.numericalize(t, "tgt") for t in tgt_tokens]
    val_tokens = word_tokenize_many(lines(corpus, "val.en"), "en")
    assert as_lists(splits["val"]["tgt"]) == [reference.numericalize(t, "tgt") for t in val_tokens]
    assert splits["val"]["refs"] == [" ".join(t) for t in val_tokens]
    assert stats["max_tokens"]["train"]["src"] == max(len(t) for t in src_tokens) + 2
    assert not (folder / "scratch").exists()  # the provisional ids are gone


@pytest.mark.slow
def test_chunks_and_threads_change_no_byte_of_the_cache(corpus, tmp_path, monkeypatch):
    cfg = config(corpus, tmp_path / "one")
    one = build(cfg, chunk_bytes=1 << 24)  # every file in one chunk
    monkeypatch.setattr(tokenise, "usable_cores", lambda: 1)
    cfg = config(corpus, tmp_path / "many")
    many = build(cfg, chunk_bytes=3000)  # many chunks, one thread
    assert one.name == many.name
    for side in ("src", "tgt"):
        for name in ids_files("train", side):
            assert (one / name).read_bytes() == (many / name).read_bytes(), name
    assert (one / "text" / "spm.model").read_bytes() == (many / "text" / "spm.model").read_bytes()


def test_a_long_training_split_logs_its_progress(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenise, "PROGRESS_EVERY_S", 0.0)
    cfg = config(corpus, tmp_path / "cache", "data.spm_vocab_size=40")
    said = []
    build(cfg, log=said.append, chunk_bytes=20_000)
    progress = [line for line in said if line.startswith("tokenising the training split: ")]
    assert len(progress) >= 4 and progress[-1] == "tokenising the training split: 6,000 of 6,000 sentences"


# --------------------------------------------------------------------------- SentencePiece on a sample


def test_sentencepiece_trains_on_a_sample_of_a_larger_split_drawn_with_the_seed(corpus, tmp_path):
    built = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        cfg = config(corpus, tmp_path / name, "data.spm_sample=1000", "data.spm_vocab_size=40", f"train.seed={seed}")
        said = []
        built[name] = build(cfg, log=said.append, seed=seed)
        assert "SentencePiece trains on 1000 of 6000 sentences (data.spm_sample)" in said
    manifest = json.loads((built["a"] / MANIFEST).read_text())
    assert manifest["settings"]["spm_sample"] == {"sentences": 1000, "seed": 5}
    assert manifest["stats"]["spm_sentences"] == 1000
    model = {name: (folder / "text" / "spm.model").read_bytes() for name, folder in built.items()}
    assert model["a"] == model["b"] and built["a"].name == built["b"].name  # the same seed, the same sample
    assert model["a"] != model["c"] and built["a"].name != built["c"].name  # another seed, another sample, another key
    # Every pair is still tokenised, with the sampled model.
    assert len(read_cache(built["a"])[1]["train"]["src"]) == 3000


@pytest.mark.slow
def test_a_sample_at_least_the_split_changes_nothing(corpus, tmp_path):
    built = {}
    for name, sample, seed in (("every", 0, 1), ("larger", 6000, 1), ("other_seed", 6000, 2)):
        cfg = config(corpus, tmp_path / name, f"data.spm_sample={sample}", "data.spm_vocab_size=40")
        said = []
        built[name] = build(cfg, log=said.append, seed=seed)
        assert not [line for line in said if "data.spm_sample" in line]
    model = {name: (folder / "text" / "spm.model").read_bytes() for name, folder in built.items()}
    assert model["every"] == model["larger"] == model["other_seed"]
    assert built["larger"].name == built["other_seed"].name  # one cache for every seed
    assert "spm_sample" not in json.loads((built["larger"] / MANIFEST).read_text())["settings"]


def test_the_resume_fingerprint_carries_the_sample_and_needs_the_seed(corpus, tmp_path):
    cfg = config(corpus, tmp_path / "cache", "data.spm_sample=1000")
    fingerprint = data_fingerprint(cfg.data, seed=3)
    assert fingerprint["settings"]["spm_sample"] == {"sentences": 1000, "seed": 3}
    assert data_fingerprint(cfg.data, seed=4) != fingerprint
    with pytest.raises(ValueError, match="train.seed"):
        data_fingerprint(cfg.data)
    assert "spm_sample" not in data_fingerprint(config(corpus, tmp_path / "cache").data)["settings"]


def test_picked_lines_are_the_rows_asked_for_across_chunks():
    text = [f"line {i}" for i in range(1000)]
    chunks = [text[i:i + 37] for i in range(0, 1000, 37)]
    rows = np.sort(np.random.default_rng(0).choice(1000, size=100, replace=False))
    assert list(picked_lines(chunks, rows)) == [text[r] for r in rows]
    assert list(picked_lines(chunks, np.array([0, 36, 37, 999]))) == ["line 0", "line 36", "line 37", "line 999"]


def test_spm_sample_of_one_is_refused():
    with pytest.raises(ConfigError, match=r"data\.spm_sample must be 0 \(every sentence\) or at least 2"):
        load_config("tiny", ["data.spm_sample=1"])


# --------------------------------------------------------------------------- streaming the files


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_a_file_streams_into_the_lines_of_reading_it_whole(tmp_path, chunk_bytes):
    text = "\ufeffÜber die Straße\r\n  a line longer than a chunk of seven bytes  \n\n\tß\u2028x\nlast without newline"
    path = tmp_path / "f.de"
    path.write_bytes(text.encode("utf-8"))
    whole, digest = read_file(path)
    assert whole == ["Über die Straße", "a line longer than a chunk of seven bytes", "", "ß\u2028x",
                     "last without newline"]
    assert [line for chunk in file_chunks(path, chunk_bytes) for line in chunk] == whole
    (tmp_path / "f.de.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    assert [line for chunk in file_chunks(tmp_path / "f.de.gz", chunk_bytes) for line in chunk] == whole


def test_a_file_is_checked_and_counted_in_chunks(tmp_path):
    path = tmp_path / "f.de"
    path.write_bytes("eins\nzwei\n".encode() * 50 + b"drei")
    facts = check_file(path, chunk_bytes=16)
    assert facts == FileFacts(hashlib.sha256(path.read_bytes()).hexdigest(), 101) == check_file(path)
    packed = tmp_path / "f.de.gz"  # the sha256 of the compressed bytes, the lines of the text inside
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert check_file(packed, chunk_bytes=16) == FileFacts(hashlib.sha256(packed.read_bytes()).hexdigest(), 101)
    path.write_bytes("eins\nzwei\n".encode() * 50 + b"drei \xe9\n")
    for check in (lambda: check_file(path, chunk_bytes=16), lambda: list(file_chunks(path, chunk_bytes=16))):
        with pytest.raises(DataError, match=r"f\.de is not UTF-8 text: line 101 has the byte 0xe9"):
            check()
    path.write_bytes(b" \n\t\n" * 40)
    with pytest.raises(DataError, match=r"f\.de is empty"):
        check_file(path, chunk_bytes=16)


# --------------------------------------------------------------------------- the long-sentence policy


def reference_policy(rows, limit, skip):
    """The policy as it was, one sentence pair at a time."""
    out, kept, truncated, skipped = [], [], 0, 0
    for i, (s, t) in enumerate(rows):
        if len(s) > limit or len(t) > limit:
            if skip:
                skipped += 1
                continue
            truncated += 1
        out.append((truncate_ids(s, limit), truncate_ids(t, limit)))
        kept.append(i)
    return out, kept, truncated, skipped


@pytest.mark.parametrize("skip", [False, True])
def test_the_long_sentence_policy_on_the_lengths_does_what_the_loop_did(skip):
    rng = np.random.default_rng(0)
    rows = [([0, *rng.integers(4, 50, size=n).tolist(), 1], [0, *rng.integers(4, 50, size=m).tolist(), 1])
            for n, m in rng.integers(1, 20, size=(300, 2))]
    src, tgt, keep, truncated, skipped = apply_long_policy(RaggedIds.from_rows([s for s, _ in rows]),
                                                           RaggedIds.from_rows([t for _, t in rows]), 12, skip)
    want, kept, want_truncated, want_skipped = reference_policy(rows, 12, skip)
    assert (truncated, skipped) == (want_truncated, want_skipped) and (truncated or skipped)
    assert keep.tolist() == kept
    assert [(s.tolist(), t.tolist()) for s, t in zip(src, tgt)] == want
