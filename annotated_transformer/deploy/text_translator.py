"""`TextTranslator`: the half of a translator that works on text, the same for every engine.

`Translator` (translator.py, our decoder) and `CT2Translator` (ct2_translator.py, CTranslate2) both
build on it, so both encode, truncate, skip empty lines and keep the input order by the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import Config


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

    def translate(self, sentences: Sequence[str], beam_size: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None) -> list[str]:
        """Translate sentences; returns one string per input, in input order ('' for an empty input)."""
        dec = self.config.decode
        keep = [i for i, s in enumerate(sentences) if s.strip()]
        sources = [self.text.text_to_ids(sentences[i], "src") for i in keep]
        outputs = self.translate_ids(sources, beam_size or dec.beam_size, dec.alpha if alpha is None else alpha,
                                     batch_size or dec.batch_size) if sources else []
        result = [""] * len(sentences)
        for i, ids in zip(keep, outputs):
            result[i] = self.text.ids_to_text(ids, "tgt")
        return result

    def translate_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int) -> list[list[int]]:
        """Output ids (without <s> and </s>) for source ids (<s> ... </s>), in input order."""
        raise NotImplementedError
