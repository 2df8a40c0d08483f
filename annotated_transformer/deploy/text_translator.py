"""`TextTranslator`: the half of a translator that works on text, the same for every engine.

`Translator` (translator.py, our decoder) and `CT2Translator` (ct2_translator.py, CTranslate2) both
build on it, so both encode, truncate, skip empty lines, keep the input order and check their options
by the same rules, and both give n-best lists as `Hypothesis` objects.
"""

from __future__ import annotations

import numbers
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from ..config import Config
from ..config.loading import check_alpha
from ..runtime.errors import ConfigError


@dataclass
class Hypothesis:
    """One translation of an n-best list (`translate(..., n_best=N)`): its text, its score and its target tokens.

    The score is the length-penalised log-probability the beam ranks by, higher is better:
    sum log p(Y) / ((5 + |Y|) / 6) ** alpha, Wu et al.'s length penalty, with greedy search (beam 1)
    too (CTranslate2 divides by |Y| ** alpha instead); with alpha 0, the plain sum of
    log-probabilities. |Y| counts the tokens and </s>. An empty input gives one empty hypothesis scored 0.
    """

    text: str
    score: float
    tokens: list[str]  # the target vocabulary's tokens (words or pieces), without <s> and </s>


class TruncationWarning(UserWarning):
    """Input longer than the model's limit (data.max_sentence_len) was cut to it before translating."""


class TextTranslator:
    """Text in, text out, through the run's own text pipeline: what every engine's translator shares.

    A subclass holds `text` (the TextPipeline) and `config`, and decodes id lists in `translate_ids` (and, with
    their scores, in `n_best_ids`).
    """

    text: Any
    config: Config

    def source_ids(self, sentence: str) -> tuple[list[int], bool]:
        """Source ids (<s> ... </s>) and whether the sentence had to be truncated to fit data.max_sentence_len."""
        ids = self.text.text_to_ids(sentence, "src")
        truncated = len(self.text.tokenize(sentence, "src")) + 2 > len(ids)
        return ids, truncated

    def encode(self, sentences: Sequence[str], stacklevel: int = 1) -> tuple[list[list[int]], list[bool]]:
        """Source ids (<s> ... </s>) of each sentence cut to data.max_sentence_len, and whether it was cut; one
        TruncationWarning names how many were (`stacklevel` 1 names the caller's line, 2 its caller's, ...)."""
        ids = self.text.ids_many(sentences, "src")  # untruncated: their lengths tell which are cut
        limit = self.text.max_sentence_len
        cut = [len(i) > limit for i in ids]
        if any(cut):
            was = "was" if sum(cut) == 1 else "were"
            warnings.warn(f"{sum(cut)} of {len(ids)} sentence{'s' if len(ids) > 1 else ''} {was} longer than the "
                          f"model's limit of {limit} tokens (data.max_sentence_len, <s> and </s> included) and {was} "
                          "cut to it", TruncationWarning, stacklevel=stacklevel + 1)
        return [self.text.truncate(i) for i in ids], cut

    def decode_settings(self, beam: int | None = None, alpha: float | None = None,
                 batch_size: int | None = None) -> tuple[int, float, int]:
        """beam, alpha and batch_size checked (a TypeError or one ConfigError line), None as the translator's own."""
        dec = self.config.decode
        return (dec.beam_size if beam is None else checked_count("beam", beam),
                dec.alpha if alpha is None else checked_alpha(alpha),
                dec.batch_size if batch_size is None else checked_count("batch_size", batch_size))

    @overload
    def translate(self, sentences: str, beam: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, n_best: None = None, *, beam_size: int | None = None) -> str: ...

    @overload
    def translate(self, sentences: list[str] | tuple[str, ...], beam: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, n_best: None = None, *,
                  beam_size: int | None = None) -> list[str]: ...

    @overload
    def translate(self, sentences: str, beam: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, *, n_best: int, beam_size: int | None = None) -> list[Hypothesis]: ...

    @overload
    def translate(self, sentences: list[str] | tuple[str, ...], beam: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None, *, n_best: int,
                  beam_size: int | None = None) -> list[list[Hypothesis]]: ...

    def translate(self, sentences: str | list[str] | tuple[str, ...], beam: int | None = None,
                  alpha: float | None = None, batch_size: int | None = None, n_best: int | None = None, *,
                  beam_size: int | None = None) -> str | list[str] | list[Hypothesis] | list[list[Hypothesis]]:
        """Translate a sentence (str -> str) or a list or tuple of them (-> list of str, in input order).

        beam: the beam size, 1 for greedy search. alpha: beam search's length-penalty exponent,
        ((5 + |Y|) / 6) ** alpha. batch_size: sentences decoded together (of similar length). Each,
        left at None, is the translator's setting: the checkpoint's decode.beam_size, decode.alpha and
        decode.batch_size, or what `Translator.load` was given.
        n_best: with a number N (at most beam), each sentence gives instead a list of its N best
        translations as `Hypothesis` (text, score, tokens), best first; the first is the translation
        given without n_best.
        beam_size: beam's older name (deprecated).

        An empty or blank sentence gives ''. A sentence longer than the model's limit
        (data.max_sentence_len tokens) is translated cut to it, with a TruncationWarning.
        """
        one = isinstance(sentences, str)
        batch = [sentences] if one else sentences
        check_sentences(batch)
        if beam_size is not None:
            if beam is not None:
                raise TypeError("translate() got both beam and beam_size, its older name: give beam alone")
            beam = checked_count("beam_size", beam_size)
            warnings.warn("translate(beam_size=...) is now translate(beam=...)", DeprecationWarning, stacklevel=2)
        beam, alpha, batch_size = self.decode_settings(beam, alpha, batch_size)
        if n_best is not None and checked_count("n_best", n_best) > beam:
            raise ConfigError(f"n_best ({n_best}) cannot exceed the beam ({beam}): pass beam={n_best} or more")
        keep = [i for i, s in enumerate(batch) if s.strip()]
        sources, _ = self.encode([batch[i] for i in keep], stacklevel=2)  # the warning names our caller's line
        if n_best is None:
            result: list = [""] * len(batch)
            for i, ids in zip(keep, self.translate_ids(sources, beam, alpha, batch_size) if sources else []):
                result[i] = self.text.ids_to_text(ids, "tgt")
        else:
            result = [[Hypothesis("", 0.0, [])] for _ in batch]
            for i, found in zip(keep, self.n_best_ids(sources, beam, alpha, batch_size, n_best) if sources else []):
                result[i] = [Hypothesis(self.text.ids_to_text(ids, "tgt"), score, self.text.ids_to_tokens(ids, "tgt"))
                             for ids, score in found]
        return result[0] if one else result

    def translate_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int) -> list[list[int]]:
        """Output ids (without <s> and </s>) for source ids (<s> ... </s>), in input order."""
        raise NotImplementedError

    def n_best_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int,
                   n_best: int) -> list[list[tuple[list[int], float]]]:
        """Each source's `n_best` hypotheses, best first: (output ids without <s> and </s>, score), in input order."""
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
    """`value` as a count of at least 1 (beam, n_best, batch_size): a TypeError or one ConfigError line if not."""
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
    check_alpha(value, "alpha")
    return float(value)
