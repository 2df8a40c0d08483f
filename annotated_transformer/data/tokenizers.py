"""The two tokenisers: spaCy's rule-based word tokenizer and a joint SentencePiece subword model.

spaCy and SentencePiece are imported on first use only, so that loading a cached dataset or a
checkpoint does not pay for them.
"""

from __future__ import annotations

import io
import re
import itertools
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

import numpy as np

from ..runtime.errors import ConfigError, UserError
from .vocab import BOS, EOS, PAD, SPECIALS, UNK


@cache
def spacy_tokenizer(lang: str) -> Any:
    """spaCy's rule-based tokenizer for `lang` ('de', 'en', 'fr', ...: `spacy.blank(lang)`, no model download)."""
    try:
        import spacy
    except ImportError:
        # Training from a data cache prepared elsewhere needs no spaCy (data/cache.py finds the cache).
        raise UserError("word-mode text (data.tokenizer=word) is tokenised with spaCy, which is not installed "
                        "here: pip install 'spacy>=3.7,<4'") from None
    try:
        return spacy.blank(lang).tokenizer
    except ImportError as exc:  # a language spaCy does not know, or one whose tokenizer needs another package
        known = "E048" not in str(exc)
        reason = f"it needs a package that is not installed: {str(exc).split('. ')[0]}" if known else \
            "spaCy does not know the language"
        raise ConfigError(f"data.tokenizer=word has no word tokenizer for '{lang}' ({reason}); set "
                          "data.tokenizer=spm: SentencePiece learns subwords of any language") from None


def _normalise(text: str, lowercase: bool) -> str:
    return text.lower() if lowercase else text


def word_tokenize(text: str, lang: str, lowercase: bool = False) -> list[str]:
    """spaCy tokens of one sentence, whitespace tokens dropped, optionally lowercased first."""
    # The notebook kept spaCy's whitespace tokens (a double space or a tab became a token of its own);
    # they carry nothing to translate, so they are dropped.
    return [t.text for t in spacy_tokenizer(lang)(_normalise(text, lowercase)) if not t.is_space]


def word_tokenize_many(texts: Sequence[str], lang: str, lowercase: bool = False,
                       batch_size: int = 1000) -> list[list[str]]:
    """`word_tokenize` over many sentences with spaCy's batched `pipe` (the same tokens, less overhead)."""
    tok = spacy_tokenizer(lang)
    docs = tok.pipe((_normalise(t, lowercase) for t in texts), batch_size=batch_size)
    return [[t.text for t in doc if not t.is_space] for doc in docs]


def train_sentencepiece(texts: Iterable[str], vocab_size: int, num_threads: int = 2) -> bytes:
    """Train a unigram SentencePiece model on `texts` and return the serialized model.

    The specials get the ids of the word vocabularies (<s>=0, </s>=1, <blank>=2, <unk>=3), so the
    rest of the code never needs to know which tokenizer made the ids.
    """
    import sentencepiece as spm

    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=buffer, vocab_size=vocab_size, model_type="unigram",
            bos_id=BOS, eos_id=EOS, pad_id=PAD, unk_id=UNK,
            bos_piece=SPECIALS[BOS], eos_piece=SPECIALS[EOS], pad_piece=SPECIALS[PAD], unk_piece=SPECIALS[UNK],
            character_coverage=1.0,  # keep every character of both languages (umlauts, accents)
            num_threads=num_threads, minloglevel=2,
        )
    except RuntimeError as exc:
        message = " ".join(str(exc).split())
        small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
        large = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message)
        if small:  # its advice names SentencePiece's own --character_coverage, which is no key here
            raise ConfigError(f"data.spm_vocab_size={vocab_size} is smaller than the training text's distinct "
                              f"characters and special tokens ({small[1]}); raise data.spm_vocab_size to "
                              f"{small[1]} or more") from None
        if large:
            raise ConfigError(f"data.spm_vocab_size={vocab_size} is more pieces than the training text holds (at "
                              f"most {large[1]}); lower data.spm_vocab_size to {large[1]} or less") from None
        if "Vocabulary size" in message:  # drop SentencePiece's source-location prefix
            raise ConfigError(f"data.spm_vocab_size={vocab_size} does not fit the training text: "
                              f"{message[message.index('Vocabulary size'):]}") from None
        raise
    return buffer.getvalue()


class SubwordModel:
    """A loaded SentencePiece model (built from its serialized bytes, so it can be saved anywhere)."""

    def __init__(self, model_bytes: bytes) -> None:
        import sentencepiece as spm

        self.model_bytes = bytes(model_bytes)
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)

    def pieces(self) -> list[str]:
        """Every piece, in id order."""
        return [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]

    def encode_pieces(self, text: str) -> list[str]:
        """The pieces of one sentence."""
        return self.sp.encode(text, out_type=str)

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Piece ids of many sentences (no <s>/</s>)."""
        return self.sp.encode(texts, out_type=int)

    def encode_flat(self, texts: list[str], dtype: np.dtype, num_threads: int) -> tuple[np.ndarray, np.ndarray]:
        """<s> ids </s> of many sentences back to back (`dtype`), and each one's length (int64), encoded on
        `num_threads` of SentencePiece's threads (the ids do not depend on them)."""
        rows = self.sp.encode(texts, out_type=int, add_bos=True, add_eos=True, num_threads=num_threads)
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(lengths.sum()))
        return flat, lengths

    def sample_ids(self, texts: list[str], alpha: float, nbest: int, seed: int) -> list[list[int]]:
        """Piece ids of many sentences, each segmentation drawn at random (subword regularisation, Kudo 2018).

        The same `seed` gives the same draws: SentencePiece's generator is reseeded first, and the
        sentences are encoded on one thread, because with several the draws depend on the scheduling.
        """
        import sentencepiece as spm

        spm.set_random_generator_seed(seed % 2**32)
        return self.sp.encode(texts, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest,
                              num_threads=1)

    def decode_ids(self, ids: list[int]) -> str:
        """Detokenised text of piece ids."""
        return self.sp.decode(ids)
