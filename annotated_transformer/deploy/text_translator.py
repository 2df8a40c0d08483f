"""`TextTranslator`: the half of a translator that works on text, the same for every engine.

`Translator` (translator.py, our decoder) and `CT2Translator` (ct2_translator.py, CTranslate2) both
build on it, so both encode, truncate, skip empty lines and keep the input order by the same rules.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any, overload

from ..config import Config
from ..runtime.errors import ConfigError


class TextTranslator:
    """Text in, text out, through the run's own text pipeline: what every engine's translator shares.

    A subclass holds `text` (the TextPipeline) and `config`, and decodes id lists in `translate_ids`.
    """

    text: Any
    config: Config

    def source_ids(self, sentence: str) -> tuple[list[int], bool]:
        """Source ids (<s> ... </s>) and whether the sentence had to be truncated to fit data.max_sentence_len."""
        ids = self.text.text_to_ids(sentence, "src")
        truncated = len(self.text.tokenize(sentence, "src")) + 2 > len(ids)
        return ids, truncated

    @overload
    def translate(self, sentences: str, beam_size: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None) -> str: ...

    @overload
    def translate(self, sentences: list[str] | tuple[str, ...], beam_size: int | None = None,
                  alpha: float | None = None, batch_size: int | None = None) -> list[str]: ...

    def translate(self, sentences: str | list[str] | tuple[str, ...], beam_size: int | None = None,
                  alpha: float | None = None, batch_size: int | None = None) -> str | list[str]:
        """Translate a sentence (str -> str) or a list or tuple of them (-> list of str, in input order).

        An empty or blank sentence gives ''. beam_size, alpha and batch_size default to the translator's
        decoding settings (the checkpoint's, or what `Translator.load` was given).
        """
        if isinstance(sentences, str):
            return self.translate([sentences], beam_size, alpha, batch_size)[0]
        check_sentences(sentences)
        dec = self.config.decode
        beam_size = dec.beam_size if beam_size is None else checked_count("beam_size", beam_size)
        alpha = dec.alpha if alpha is None else checked_alpha(alpha)
        batch_size = dec.batch_size if batch_size is None else checked_count("batch_size", batch_size)
        keep = [i for i, s in enumerate(sentences) if s.strip()]
        sources = [self.text.text_to_ids(sentences[i], "src") for i in keep]
        outputs = self.translate_ids(sources, beam_size, alpha, batch_size) if sources else []
        result = [""] * len(sentences)
        for i, ids in zip(keep, outputs):
            result[i] = self.text.ids_to_text(ids, "tgt")
        return result

    def translate_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int) -> list[list[int]]:
        """Output ids (without <s> and </s>) for source ids (<s> ... </s>), in input order."""
        raise NotImplementedError


_TAKES = "translate() takes a str or a list or tuple of str"


def check_sentences(sentences: Any) -> None:
    """A TypeError naming what translate() takes and what it got, unless `sentences` is a list or tuple of str."""
    if isinstance(sentences, (bytes, bytearray)):
        raise TypeError(f"{_TAKES}, got {type(sentences).__name__}: decode it first, e.g. .decode('utf-8')")
    if not isinstance(sentences, (list, tuple)):
        ordered = hasattr(sentences, "__iter__") and not isinstance(sentences, (set, frozenset, dict))
        hint = "; wrap it in list(...)" if ordered else ""  # a generator, a map, a pandas Series, ...
        raise TypeError(f"{_TAKES}, got {type(sentences).__name__}{hint}")
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"{_TAKES}, got a {type(sentences).__name__} whose item {i} is "
                            f"{type(sentence).__name__}")


def checked_count(name: str, value: Any) -> int:
    """`value` as a whole number of at least 1 (beam_size, batch_size): a TypeError or one ConfigError line if not."""
    if isinstance(value, bool):  # an int to Python, never a count anyone meant
        raise TypeError(f"{name} must be a whole number, got {value!r}")
    try:
        count = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a whole number, got {type(value).__name__} {value!r}") from None
    if count < 1:
        raise ConfigError(f"{name} must be at least 1, got {count}")
    return count


def checked_alpha(value: Any) -> float:
    """`value` as a length-penalty exponent (a number, not negative): a TypeError or one ConfigError line if not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"alpha must be a number, got {type(value).__name__} {value!r}")
    if not value >= 0:  # NaN too
        raise ConfigError(f"alpha must be a number of at least 0, got {value}")
    return float(value)
