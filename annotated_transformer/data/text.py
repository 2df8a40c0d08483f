"""`TextPipeline`: everything that turns a sentence into ids and ids back into a sentence.

One object holds the tokenisation mode, the languages, the vocabularies (or the joint
SentencePiece model) and the length limit. It is built once from the training split, saved in
every run directory (`save`/`load`, human-readable files) and embedded in every checkpoint
(`state_dict`/`from_state_dict`, safe for `torch.load(weights_only=True)`), so a checkpoint
translates on a machine that has never seen the dataset.

    word mode  spaCy rule-based tokens, one vocabulary per language (min_freq from the training split)
    spm mode   one joint de+en SentencePiece model; src_vocab and tgt_vocab are the same object
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from ..runtime.files import atomic_write
from ..runtime.errors import DataError, excerpt
from .tokenizers import SubwordModel, train_sentencepiece, word_tokenize, word_tokenize_many
from .vocab import BOS, EOS, PAD, UNK, Vocab

IdsT = TypeVar("IdsT", list[int], np.ndarray)

TEXT_FORMAT = 1
SIDES = ("src", "tgt")
MODES = ("word", "spm")
SETTINGS_FILE = "text_pipeline.json"
# Every file `write_text_files` writes (one of them a kind of tokenizer's): what a folder of its may lose.
TEXT_FILES = re.compile(r"^(?:vocab\.(?:src|tgt)\.json|spm\.(?:model|vocab)|text_pipeline\.json)$")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def _to_int_list(ids: Any) -> list[int]:
    if hasattr(ids, "tolist"):  # tensors and numpy arrays
        ids = ids.tolist()
    return [int(i) for i in ids]


def truncate_ids(ids: IdsT, limit: int) -> IdsT:
    """The first limit - 1 ids and the closing </s> when `ids` (a list or an array) is longer than `limit`."""
    if len(ids) <= limit:
        return ids
    if isinstance(ids, np.ndarray):
        return np.append(ids[: limit - 1], EOS)
    return [*ids[: limit - 1], EOS]


class TextPipeline:
    """Tokenise, numericalise, truncate, and decode, the same way in training, evaluation and translation."""

    pad_id, bos_id, eos_id, unk_id = PAD, BOS, EOS, UNK

    def __init__(self, mode: str, src_lang: str, tgt_lang: str, src_vocab: Vocab, tgt_vocab: Vocab,
                 lowercase: bool = False, max_sentence_len: int = 128, spm_model: bytes | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "spm" and spm_model is None:
            raise ValueError("spm mode needs the serialized SentencePiece model")
        if max_sentence_len < 3:
            raise ValueError(f"max_sentence_len must be at least 3 (<s>, a token, </s>), got {max_sentence_len}")
        self.mode, self.src_lang, self.tgt_lang = mode, src_lang, tgt_lang
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.lowercase, self.max_sentence_len = bool(lowercase), int(max_sentence_len)
        self.spm_model = bytes(spm_model) if spm_model is not None else None
        self._subword: SubwordModel | None = None  # loaded on first use

    # ------------------------------------------------------------------ construction

    @classmethod
    def for_words(cls, src_tokens: Sequence[list[str]], tgt_tokens: Sequence[list[str]], *, src_lang: str,
                  tgt_lang: str, lowercase: bool = False, max_sentence_len: int = 128,
                  min_freq: int = 2) -> TextPipeline:
        """Word mode: vocabularies counted from already tokenised training sentences."""
        return cls("word", src_lang, tgt_lang, Vocab.build(src_tokens, min_freq), Vocab.build(tgt_tokens, min_freq),
                   lowercase=lowercase, max_sentence_len=max_sentence_len)

    @classmethod
    def for_word_counts(cls, src_counts: Mapping[str, int], tgt_counts: Mapping[str, int], *, src_lang: str,
                        tgt_lang: str, lowercase: bool = False, max_sentence_len: int = 128,
                        min_freq: int = 2) -> TextPipeline:
        """Word mode from token counts (token -> occurrences in the training split): `for_words`' vocabularies."""
        return cls("word", src_lang, tgt_lang, Vocab.from_counts(src_counts, min_freq),
                   Vocab.from_counts(tgt_counts, min_freq), lowercase=lowercase, max_sentence_len=max_sentence_len)

    @classmethod
    def for_subwords(cls, src_texts: Iterable[str], tgt_texts: Iterable[str], *, src_lang: str, tgt_lang: str,
                     vocab_size: int, lowercase: bool = False, max_sentence_len: int = 128) -> TextPipeline:
        """Spm mode: one SentencePiece model trained on the training text of both languages (every source
        sentence, then every target sentence; iterables are read once, as SentencePiece asks for them)."""
        texts = (t.lower() if lowercase else t for t in itertools.chain(src_texts, tgt_texts))
        model = train_sentencepiece(texts, vocab_size)
        vocab = Vocab(SubwordModel(model).pieces())
        return cls("spm", src_lang, tgt_lang, vocab, vocab, lowercase=lowercase, max_sentence_len=max_sentence_len,
                   spm_model=model)

    # ------------------------------------------------------------------ properties

    @property
    def shared_vocab(self) -> bool:
        """True when source and target share one vocabulary (spm mode), as tied embeddings need."""
        return self.src_vocab is self.tgt_vocab

    @property
    def subword(self) -> SubwordModel:
        """The loaded SentencePiece model (spm mode only)."""
        if self.spm_model is None:
            raise ValueError("this TextPipeline is in word mode; it has no SentencePiece model")
        if self._subword is None:
            self._subword = SubwordModel(self.spm_model)
        return self._subword

    def _check_side(self, side: str) -> None:
        if side not in SIDES:
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")

    def lang(self, side: str) -> str:
        """The language code of 'src' or 'tgt'."""
        self._check_side(side)
        return self.src_lang if side == "src" else self.tgt_lang

    def vocab(self, side: str) -> Vocab:
        """The vocabulary of 'src' or 'tgt'."""
        self._check_side(side)
        return self.src_vocab if side == "src" else self.tgt_vocab

    # ------------------------------------------------------------------ text -> ids

    def tokenize(self, text: str, side: str = "src") -> list[str]:
        """Tokens of one sentence: spaCy words (lowercased if set), or SentencePiece pieces."""
        if self.mode == "word":
            return word_tokenize(text, self.lang(side), self.lowercase)
        self._check_side(side)
        return self.subword.encode_pieces(text.lower() if self.lowercase else text)

    def tokenize_many(self, texts: Sequence[str], side: str = "src") -> list[list[str]]:
        """`tokenize` over many sentences, batched."""
        if self.mode == "word":
            return word_tokenize_many(texts, self.lang(side), self.lowercase)
        self._check_side(side)
        return [self.subword.encode_pieces(t.lower() if self.lowercase else t) for t in texts]

    def numericalize(self, tokens: Sequence[str], side: str = "src") -> list[int]:
        """<s> ids </s> of a token list, untruncated."""
        return [BOS, *self.vocab(side).lookup_indices(tokens), EOS]

    def ids_many(self, texts: Sequence[str], side: str = "src") -> list[list[int]]:
        """<s> ids </s> of many sentences, untruncated (the dataset builder applies the long-sentence policy)."""
        if self.mode == "word":
            return [self.numericalize(toks, side) for toks in self.tokenize_many(texts, side)]
        self._check_side(side)
        return [[BOS, *ids, EOS] for ids in self.subword.encode_ids(self._cased(texts))]

    def ids_flat(self, texts: list[str], side: str, dtype: np.dtype, num_threads: int = 1
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Spm mode: `ids_many` of many sentences as one flat `dtype` array and each sentence's length (int64), the
        sentences encoded on `num_threads` threads: a chunk of a split for the data cache."""
        self._check_side(side)
        if self.mode != "spm":
            raise ValueError("flat ids in one call need the SentencePiece (spm) tokenizer")
        return self.subword.encode_flat(self._cased(texts), dtype, num_threads)

    def sampled_ids_many(self, texts: Sequence[str], side: str, alpha: float, nbest: int, seed: int
                         ) -> list[list[int]]:
        """`ids_many` with a randomly drawn segmentation of each sentence (subword mode only; see
        SubwordModel.sample_ids); untruncated."""
        self._check_side(side)
        if self.mode != "spm":
            raise ValueError("sampled segmentations need the SentencePiece (spm) tokenizer")
        return [[BOS, *ids, EOS] for ids in self.subword.sample_ids(self._cased(texts), alpha, nbest, seed)]

    def _cased(self, texts: Sequence[str]) -> list[str]:
        """The texts as the subword model reads them: lowercased when the pipeline lowercases."""
        return [t.lower() for t in texts] if self.lowercase else list(texts)

    def truncate(self, ids: list[int]) -> list[int]:
        """Cut ids to max_sentence_len, keeping the closing </s>."""
        return truncate_ids(ids, self.max_sentence_len)

    def text_to_ids(self, text: str, side: str = "src") -> list[int]:
        """<s> ids </s> of one sentence, truncated to max_sentence_len (the final </s> is kept)."""
        if self.mode == "word":
            ids = self.numericalize(self.tokenize(text, side), side)
        else:
            ids = self.ids_many([text], side)[0]
        return self.truncate(ids)

    # ------------------------------------------------------------------ ids -> text

    def _content_ids(self, ids: Any) -> list[int]:
        """The ids between <s> and the first </s>, padding dropped."""
        out = []
        for i in _to_int_list(ids):
            if i == EOS:
                break
            if i not in (BOS, PAD):
                out.append(i)
        return out

    def ids_to_tokens(self, ids: Any, side: str = "tgt") -> list[str]:
        """The tokens (words or pieces) of an id sequence: <s> and <blank> dropped, stopping at </s>."""
        return self.vocab(side).lookup_tokens(self._content_ids(ids))

    def ids_to_text(self, ids: Any, side: str = "tgt") -> str:
        """The text of an id sequence: word mode joins tokens with single spaces; spm mode detokenises."""
        if self.mode == "word":
            return " ".join(self.ids_to_tokens(ids, side))
        self._check_side(side)
        return self.subword.decode_ids(self._content_ids(ids))

    # ------------------------------------------------------------------ persistence

    def settings(self) -> dict[str, Any]:
        """The scalar settings (no vocabularies)."""
        return {"format": TEXT_FORMAT, "mode": self.mode, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang,
                "lowercase": self.lowercase, "max_sentence_len": self.max_sentence_len}

    def state_dict(self) -> dict[str, Any]:
        """A checkpoint-safe dict: plain Python values, and the SentencePiece model as a uint8 tensor."""
        state = self.settings()
        if self.mode == "word":
            state.update(src_vocab=self.src_vocab.itos, tgt_vocab=self.tgt_vocab.itos, spm_model=None)
        else:  # the vocabulary is the model's piece list: storing the model alone keeps one source of truth
            model = torch.frombuffer(bytearray(self.spm_model), dtype=torch.uint8)
            state.update(src_vocab=None, tgt_vocab=None, spm_model=model)
        return state

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> TextPipeline:
        """Rebuild from `state_dict` output (no dataset needed)."""
        try:
            if d.get("format") != TEXT_FORMAT:
                raise DataError(f"text pipeline format {d.get('format')!r} is not supported (expected {TEXT_FORMAT})")
            limit = d["max_sentence_len"] if "max_sentence_len" in d else d["max_len"]  # its name before 2026-11-25
            common = {"lowercase": bool(d["lowercase"]), "max_sentence_len": int(limit)}
            if d["mode"] == "word":
                return cls("word", d["src_lang"], d["tgt_lang"], Vocab(d["src_vocab"]), Vocab(d["tgt_vocab"]), **common)
            model = d["spm_model"]
            model = model.cpu().numpy().tobytes() if isinstance(model, torch.Tensor) else bytes(model)
            vocab = Vocab(SubwordModel(model).pieces())
            return cls("spm", d["src_lang"], d["tgt_lang"], vocab, vocab, spm_model=model, **common)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise DataError(f"the saved text pipeline is incomplete or damaged ({type(exc).__name__}: {exc})") from None

    def save(self, run_dir: str | Path) -> None:
        """Write human-readable files into `run_dir` (`write_text_files`)."""
        write_text_files(self, Path(run_dir))

    @classmethod
    def load(cls, run_dir: str | Path) -> TextPipeline:
        """Read what `save` wrote; a missing or damaged file is one DataError line naming it (`read_text_files`)."""
        return cls.from_state_dict(read_text_files(Path(run_dir)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TextPipeline) and self.settings() == other.settings()
                and self.src_vocab == other.src_vocab and self.tgt_vocab == other.tgt_vocab
                and self.spm_model == other.spm_model)

    __hash__ = None  # mutable, compared by value

    def __repr__(self) -> str:
        return (f"TextPipeline({self.mode}, {self.src_lang}->{self.tgt_lang}, vocab {len(self.src_vocab)}/"
                f"{len(self.tgt_vocab)}, lowercase={self.lowercase}, max_sentence_len={self.max_sentence_len})")


def write_text_files(text: TextPipeline, folder: Path) -> None:
    """vocab.src.json + vocab.tgt.json (word) or spm.model + spm.vocab (spm), then text_pipeline.json
    (written last: its presence means complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = text.settings()
    if text.mode == "word":
        for side in SIDES:
            name = f"vocab.{side}.json"
            # indent=0: one token per line, readable and diffable
            _atomic_write_bytes(folder / name, json.dumps(text.vocab(side).to_dict(), ensure_ascii=False,
                                                          indent=0).encode("utf-8"))
            settings[f"{side}_vocab_file"] = name
    else:
        _atomic_write_bytes(folder / "spm.model", text.spm_model)
        _atomic_write_bytes(folder / "spm.vocab", ("\n".join(text.src_vocab.itos) + "\n").encode("utf-8"))
        settings["spm_model_file"] = "spm.model"
    settings["vocab_sizes"] = {"src": len(text.src_vocab), "tgt": len(text.tgt_vocab)}
    _atomic_write_bytes(folder / SETTINGS_FILE, (json.dumps(settings, indent=2) + "\n").encode("utf-8"))


class TextFileDamaged(DataError):
    """A file of a saved TextPipeline is missing or is not what `write_text_files` writes: it must be copied again."""

    def __init__(self, path: Path, reason: str | None = None) -> None:
        problem = "is missing" if reason is None else f"is damaged ({reason})"
        super().__init__(f"{path} {problem}; copy its folder again from where it was written (a run's or an "
                         "exported model's vocab/), or use the model file, which carries its tokenizer")
        self.path, self.reason = path, reason or "missing"


class TextFileUnreadable(DataError):
    """A file of a saved TextPipeline is there but cannot be read (permissions, a failing disk): nothing is wrong
    with what it holds."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(f"cannot read {path} ({error.strerror or error}); check its permissions and the disk")
        self.path, self.error = path, error


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TextFileDamaged(path) from None
    except OSError as exc:
        raise TextFileUnreadable(path, exc) from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise TextFileDamaged(path, f"not valid JSON: {excerpt(exc, 100)}") from None


def _named_file(folder: Path, settings_path: Path, settings: dict[str, Any], key: str) -> Path:
    """The file `settings[key]` names: a plain name in `folder` (the settings never point elsewhere)."""
    name = settings.get(key)
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        raise TextFileDamaged(settings_path, f"{key} is {name!r}, not a file name")
    return folder / name


def _check_settings(path: Path, settings: Any) -> None:
    """The scalar settings `TextPipeline.settings` writes, each of its type; the first wrong one names the file."""
    if not isinstance(settings, dict):
        raise TextFileDamaged(path, f"a JSON {type(settings).__name__}, not an object of settings")
    if settings.get("format") != TEXT_FORMAT:
        raise TextFileDamaged(path, f"format {settings.get('format')!r}, where this version reads {TEXT_FORMAT}")
    if settings.get("mode") not in MODES:
        raise TextFileDamaged(path, f"mode {settings.get('mode')!r} is not one of {', '.join(MODES)}")
    limit_key = "max_sentence_len" if "max_sentence_len" in settings else "max_len"  # its name before 2026-11-25
    for key, kind in (("src_lang", str), ("tgt_lang", str), ("lowercase", bool), (limit_key, int)):
        value = settings.get(key)
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 3)):
            raise TextFileDamaged(path, f"{key} is {value!r}")


def read_text_files(folder: Path) -> dict[str, Any]:
    """What `write_text_files` wrote, as a `TextPipeline.state_dict`, every file checked: a missing or damaged one
    is a `TextFileDamaged` line naming it, one that cannot be read a `TextFileUnreadable`."""
    path = folder / SETTINGS_FILE
    settings = _read_json(path)
    _check_settings(path, settings)
    state = dict(settings)
    if settings["mode"] == "word":
        for side in SIDES:
            vocab_path = _named_file(folder, path, settings, f"{side}_vocab_file")
            vocab = _read_json(vocab_path)
            itos = vocab.get("itos") if isinstance(vocab, dict) else None
            if not isinstance(itos, list) or not all(isinstance(token, str) for token in itos):
                raise TextFileDamaged(vocab_path, "not an object whose 'itos' lists the tokens")
            try:
                Vocab(itos)
            except ValueError as exc:
                raise TextFileDamaged(vocab_path, str(exc)) from None
            state[f"{side}_vocab"] = itos
        state["spm_model"] = None
    else:
        model_path = _named_file(folder, path, settings, "spm_model_file")
        model = _read_bytes(model_path)
        try:
            Vocab(SubwordModel(model).pieces())
        except RuntimeError:  # SentencePiece's own message is its C++ source line: say what it means instead
            raise TextFileDamaged(model_path, f"not a SentencePiece model ({len(model)} bytes)") from None
        except ValueError as exc:
            raise TextFileDamaged(model_path, f"its pieces do not fit: {exc}") from None
        state["spm_model"] = model
    return state
