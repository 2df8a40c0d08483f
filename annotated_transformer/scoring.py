"""Scoring translations: corpus BLEU with sacreBLEU, always with its signature, and chrF.

A BLEU figure means little without knowing how the text was tokenised and cased, so every score
carries sacreBLEU's signature (e.g. `nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0`).
The two tokenisation modes of the TextPipeline are scored differently:

  word  Hypotheses and references are spaCy tokens joined by single spaces. BLEU is computed on
        those tokens as they are (sacreBLEU `tokenize="none"`): "bleu" cased and "bleu_lc"
        lowercased. The headline is "bleu_lc", the tokenised lowercased BLEU that published
        Multi30k figures (and the notebook era's) report; it is not comparable with
        detokenised sacreBLEU.
  spm   Hypotheses are detokenised text and references the raw reference lines: the standard
        detokenised, cased sacreBLEU is the headline "bleu", with "bleu_lc" beside. Its tokenizer is
        the one sacreBLEU itself picks for the target language: 13a, or zh, ja-mecab, ko-mecab for
        Chinese, Japanese, Korean targets ("char" where MeCab is not installed; the signature says).

Both modes add "chrf" (chrF2: character 6-grams, beta 2, sacreBLEU's defaults) on the same strings.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sacrebleu.metrics import BLEU, CHRF

from .data.text import MODES
from .runtime.errors import DataError, UserError

if TYPE_CHECKING:  # the translators of either engine (deploy/ sits above this module)
    from .deploy.text_translator import TextTranslator


@dataclass(frozen=True)
class Score:
    """One corpus-level score with the sacreBLEU signature that makes it reproducible."""

    name: str  # the key in `corpus_scores`' dict: "bleu", "bleu_lc" or "chrf"
    score: float  # 0..100
    signature: str  # sacreBLEU's signature, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    details: str  # sacreBLEU's own line, e.g. "BLEU = 35.20 66.1/41.0/27.3/18.4 (BP = 1.000 ratio = ...)"

    def __str__(self) -> str:
        return f"{self.name:8s} {self.score:6.2f}  {self.signature}"


def headline_key(mode: str) -> str:
    """The key of the score to report for a tokenisation mode: "bleu_lc" for word, "bleu" for spm."""
    _check_mode(mode)
    return "bleu_lc" if mode == "word" else "bleu"


# sacreBLEU's own tokenizer for these target languages (what its command line picks); 13a for every other.
LANG_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}


@functools.cache  # what it finds installed does not change while a process runs: one check, not one a validation
def bleu_tokenizer(mode: str, lang: str | None = None) -> str:
    """sacreBLEU's `tokenize` for a tokenisation mode and target language: "none" in word mode (the model's own
    tokens), else 13a or the target language's (LANG_TOKENIZERS, by the code without its region or script), "char"
    where that one's MeCab is missing."""
    _check_mode(mode)
    # Word mode compares the model's own tokens: re-tokenising them with 13a would split them again.
    if mode == "word":
        return "none"
    base = (lang or "").lower().replace("_", "-").split("-")[0]  # zh-CN, zh_TW, ZH: zh, as OPUS names files
    tokenize = LANG_TOKENIZERS.get(base, "13a")
    try:
        BLEU(tokenize=tokenize)
    except RuntimeError:  # ja-mecab / ko-mecab need pip install 'sacrebleu[ja]' / 'sacrebleu[ko]'
        return "char"
    return tokenize


def corpus_scores(hyps: list[str], refs: list[str], mode: str, lang: str | None = None) -> dict[str, Score]:
    """BLEU (cased "bleu" and lowercased "bleu_lc") and chrF ("chrf") of hypotheses against one reference each.

    `mode` is the TextPipeline's: "word" (space-joined tokens on both sides, scored as they are)
    or "spm" (detokenised hypotheses against raw references, tokenised by sacreBLEU as `bleu_tokenizer`
    says for the target language `lang`: 13a for English and German).
    """
    tokenize = bleu_tokenizer(mode, lang)
    if not hyps:
        raise ValueError("no hypotheses to score: BLEU needs at least one translated sentence")
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references; they must pair up one to one")
    metrics = {
        "bleu": BLEU(tokenize=tokenize, force=mode == "word"),
        "bleu_lc": BLEU(tokenize=tokenize, lowercase=True, force=mode == "word"),
        "chrf": CHRF(),
    }
    streams = [list(refs)]  # sacreBLEU takes one list per reference set
    scores = {}
    for key, metric in metrics.items():
        result = metric.corpus_score(list(hyps), streams)
        scores[key] = Score(key, float(result.score), str(metric.get_signature()), result.format())
    return scores


def format_scores(scores: dict[str, Score]) -> str:
    """One line per score: name, value and signature."""
    return "\n".join(str(s) for s in scores.values())


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown tokenisation mode {mode!r}; expected one of {MODES}")


def bleu_references(raw_refs: list[str], text, tokenised: list[str] | None = None) -> list[str]:
    """References in the form `corpus_scores` compares against for `text`'s mode.

    Word mode: the raw line tokenised by the same spaCy tokenizer as training (and lowercased when
    the pipeline lowercases), tokens joined by single spaces; `tokenised` gives them ready-made
    (the data cache keeps them, so no spaCy is needed). Subword mode: the raw line itself
    (lowercased only when the pipeline lowercases, so cased BLEU is not penalised for it).
    """
    if text.mode == "word":
        if tokenised is not None:
            return list(tokenised[: len(raw_refs)])
        return [" ".join(text.tokenize(r, "tgt")) for r in raw_refs]
    return [r.lower() for r in raw_refs] if text.lowercase else list(raw_refs)


def score_translations(hyps: list[str], raw_refs: list[str], text,
                       tokenised: list[str] | None = None) -> tuple[Score, dict[str, Score]]:
    """The one scorer of training's BLEU and the evaluate command: hypotheses against raw reference lines.

    The references are put in the form `text`'s mode compares against (`bleu_references`); returns
    the headline score (`headline_key`) and every score of `corpus_scores` ("bleu", "bleu_lc", "chrf").
    """
    scores = corpus_scores(hyps, bleu_references(raw_refs, text, tokenised), text.mode, text.tgt_lang)
    return scores[headline_key(text.mode)], scores


def as_given(value: float) -> str:
    """A decoding setting as it was given, for a file name and its line: 0.6000001 is not 0.6 (`:g`), 1.0 is 1."""
    return repr(float(value)).removesuffix(".0")


def score_translator(translator: TextTranslator, checkpoint: str, split: str = "test", beam: int | None = None,
                     alpha: float | None = None, output: str | None = None, show: int = 0,
                     as_json: bool = False, data_root: str | None = None,
                     limit: int | None = None, files: tuple[str, str] | None = None,
                     overwrite: bool = True, batch_size: int | None = None,
                     reduction: tuple[str, float] | None = None, quantize: str = "none",
                     follow_link: bool = False) -> dict[str, Any]:
    """The evaluate command's work: a split of the model's data (Multi30k or its own files), or `files` (a source
    file and its reference file, one sentence a line), translated, its hypotheses written and scored.

    `translator` was loaded from `checkpoint`, which places the hypotheses unless `output` does: beside it
    (NAME.SPLIT.beamK.txt) for a split, in eval/ beside it (INPUT.beamK.txt) for files; `limit`ed to fewer
    sentences than there are, .firstN before .beamK (a name the run folder knows as its own); `reduction`, the token
    merging or pruning the translator was given (('merge', 0.1): --merge-ratio 0.1), .merge0.1 before .beamK and
    said on the summary line; `quantize`, the weights' int8 or bf16 (--quantize), .int8 or .bf16 there too, and an
    alpha other than the checkpoint's, with a beam, .alphaA. With `overwrite` False an existing hypotheses file is
    refused before anything is translated; `follow_link`: a symbolic link at `output` (the user's --out) is written
    through. `batch_size`: sentences decoded together (None: the checkpoint's
    decode.batch_size). The figures are printed (as one JSON object with `as_json`) and returned.
    """
    from .data.translation_data import read_one_split
    from .runtime.errors import ConfigError, DataError

    cfg = translator.config
    k = beam or cfg.decode.beam_size
    a = cfg.decode.alpha if alpha is None else alpha
    if files is None:
        if split not in ("val", "test"):
            raise ConfigError(f"--split must be 'val' or 'test', got {split!r}")
        if data_root is not None:
            cfg.data.root = data_root
        try:
            src_lines, ref_lines = read_one_split(cfg.data, split)
        except DataError as exc:
            if cfg.data.dataset != "files":
                raise
            raise DataError(f"{exc}; score files by name instead: --input SRC --ref REF") from None
        name, where = split, {"split": split}
        stem = Path(checkpoint).with_name(f"{Path(checkpoint).stem}.{split}")
    else:
        src_lines, ref_lines = read_pair(*files)
        name, where = Path(files[0]).name, {"input": files[0], "ref": files[1]}
        stem = Path(checkpoint).parent / "eval" / name
    part = f".first{limit}" if limit and limit < len(src_lines) else ""  # never the name of the whole split's file
    part += f".{reduction[0]}{as_given(reduction[1])}" if reduction else ""  # nor the model's own hypotheses' name
    part += f".{quantize}" if quantize != "none" else ""  # nor the full-precision weights' name
    # greedy search has no length penalty; the alpha as given (0.6000001 is not the default's 0.6)
    part += f".alpha{as_given(a)}" if k > 1 and a != cfg.decode.alpha else ""
    if limit:
        src_lines, ref_lines = src_lines[:limit], ref_lines[:limit]
    out_path = Path(output) if output else stem.with_name(f"{stem.name}{part}.beam{k}.txt")
    prepare_output(out_path, overwrite)
    t0 = time.perf_counter()
    hyps = translator.translate(src_lines, beam=k, alpha=a, batch_size=batch_size)
    seconds = time.perf_counter() - t0
    write_hypotheses(out_path, hyps, follow_link=follow_link)
    head, scores = score_translations(hyps, ref_lines, translator.text)
    result: dict[str, Any] = {
        "bleu": head.score, "signature": head.signature, "headline": head.name, **where, "beam": k, "alpha": a,
        "sentences": len(hyps), "seconds": seconds, "checkpoint": str(checkpoint), "hypotheses": str(out_path),
        "scores": {key: {"score": s.score, "signature": s.signature} for key, s in scores.items()},
    }
    if reduction:
        result[f"{reduction[0]}_ratio"] = reduction[1]
    if quantize != "none":
        result["quantize"] = quantize
    if as_json:
        print(json.dumps(result))
    else:
        reduced = ""
        if reduction:
            reduced = f", token {'merging' if reduction[0] == 'merge' else 'pruning'} {as_given(reduction[1])}"
        reduced += f", {quantize} weights" if quantize != "none" else ""
        print(f"{name}: {len(hyps)} sentences, beam {k}{reduced}, {seconds:.1f} s "
              f"({len(hyps) / max(seconds, 1e-9):.1f} sentences/s); hypotheses in {out_path}")
        print(format_scores(scores))
    if show:
        print(check_outputs(src_lines, ref_lines, hyps, n=show), file=sys.stderr if as_json else sys.stdout)
    return result


def prepare_output(path: Path, overwrite: bool) -> None:
    """Make the hypotheses file's folder; an existing file is refused unless `overwrite` (before any translating),
    as every command's output is (`refuse_to_replace`)."""
    from .runtime.files import refuse_to_replace

    refuse_to_replace(path, overwrite)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot_write(path, exc) from None


def write_hypotheses(path: Path, hyps: list[str], follow_link: bool = False) -> None:
    """`hyps` one a line in `path`, written atomically (through a symbolic link only with `follow_link`: a path
    the user named); a problem is one UserError line."""
    from .runtime.files import atomic_write

    try:
        atomic_write(path, lambda f: f.write("".join(h + "\n" for h in hyps).encode("utf-8")), follow_link=follow_link)
    except OSError as exc:
        raise _cannot_write(path, exc) from None


def _cannot_write(path: Path, exc: OSError) -> UserError:
    return UserError(f"cannot write the hypotheses to {path}: {exc.strerror or exc}; choose another --out FILE")


def read_pair(source: str, reference: str) -> tuple[list[str], list[str]]:
    """The lines of a source file and of its reference translations (UTF-8, plain or .gz, one sentence a line),
    which must pair up line by line; a DataError line when they cannot be read or do not pair up."""
    from .data.own_files import read_file

    src, _ = read_file(Path(source).expanduser())
    ref, _ = read_file(Path(reference).expanduser())
    if len(src) != len(ref):
        raise DataError(f"--input {source} has {len(src)} lines but --ref {reference} has {len(ref)}: line i of the "
                        "reference must translate line i of the input; fix the files so they pair up")
    return src, ref


def check_outputs(sources: list[str], references: list[str], hypotheses: list[str], n: int = 3,
                  start: int = 0) -> str:
    """A readable block of `n` examples (source, reference, model output), each translated once."""
    lines = []
    for i in range(start, min(start + n, len(hypotheses))):
        lines += [f"example {i}", f"  source    {sources[i]}", f"  reference {references[i]}",
                  f"  model     {hypotheses[i]}"]
    return "\n".join(lines)
