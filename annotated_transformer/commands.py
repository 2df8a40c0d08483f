"""The work behind scripts/translate.py, scripts/evaluate.py and scripts/average_checkpoints.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from .checkpoint import average_checkpoints, save_checkpoint
from .errors import CheckpointError, ConfigError, DataError, UserError
from .translator import Translator


def _check_beam(beam: int | None, alpha: float | None) -> None:
    if beam is not None and beam < 1:
        raise ConfigError(f"--beam must be at least 1, got {beam}")
    if alpha is not None and alpha < 0:
        raise ConfigError(f"--alpha must not be negative, got {alpha}")


def read_lines(source: str) -> list[str]:
    """Lines of a UTF-8 file ('-' = stdin), without their line endings; non-UTF-8 input is a UserError."""
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        name = "standard input" if source == "-" else source
        raise DataError(f"{name} is not valid UTF-8 (line {line}, byte {exc.start}); "
                        "convert it, e.g. with iconv -t UTF-8") from None
    return text.splitlines()


def translate_stream(checkpoint: str, source: str = "-", beam: int | None = None, alpha: float | None = None,
                     batch_size: int | None = None, device: str | None = None) -> int:
    """Translate every line of `source`; write one translation per line to stdout, in input order."""
    _check_beam(beam, alpha)
    lines = read_lines(source)
    translator = Translator.from_checkpoint(checkpoint, device=device)
    for number, line in enumerate(lines, 1):
        if line.strip() and translator.encode(line)[1]:
            print(f"warning: line {number} is longer than the model's limit of {translator.text.max_len} "
                  "tokens and was truncated", file=sys.stderr)
    outputs = translator.translate(lines, beam_size=beam, alpha=alpha, batch_size=batch_size)
    sys.stdout.write("".join(o + "\n" for o in outputs))
    sys.stdout.flush()
    return 0


def evaluate_checkpoint(checkpoint: str, split: str = "test", beam: int | None = None, alpha: float | None = None,
                        output: str | None = None, show: int = 0, as_json: bool = False, data_root: str | None = None,
                        device: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Translate a Multi30k split, write the hypotheses, score them with sacreBLEU; print and return the figures."""
    from .data import read_split, resolve_multi30k_dir
    from .evaluation import bleu_references, check_outputs, corpus_scores, headline_key

    _check_beam(beam, alpha)
    if split not in ("val", "test"):
        raise ConfigError(f"--split must be 'val' or 'test', got {split!r}")
    translator = Translator.from_checkpoint(checkpoint, device=device)
    cfg = translator.config
    if data_root is not None:
        cfg.data.root = data_root
    src_lines, ref_lines = read_split(resolve_multi30k_dir(cfg.data), split, cfg.data.src_lang, cfg.data.tgt_lang)
    if limit:
        src_lines, ref_lines = src_lines[:limit], ref_lines[:limit]
    k = beam or cfg.decode.beam_size
    a = cfg.decode.alpha if alpha is None else alpha
    t0 = time.perf_counter()
    hyps = translator.translate(src_lines, beam_size=k, alpha=a)
    seconds = time.perf_counter() - t0
    out_path = Path(output) if output else Path(checkpoint).with_name(f"{Path(checkpoint).stem}.{split}.beam{k}.txt")
    from .files import atomic_write

    atomic_write(out_path, lambda f: f.write("".join(h + "\n" for h in hyps).encode("utf-8")))
    mode = translator.text.mode
    scores = corpus_scores(hyps, bleu_references(ref_lines, translator.text), mode)
    head = scores[headline_key(mode)]
    result: dict[str, Any] = {
        "bleu": head.score, "signature": head.signature, "split": split, "beam": k, "alpha": a,
        "sentences": len(hyps), "seconds": seconds, "checkpoint": str(checkpoint), "hypotheses": str(out_path),
        "scores": {key: {"score": s.score, "signature": s.signature} for key, s in scores.items()},
    }
    if as_json:
        print(json.dumps(result))
    else:
        print(f"{split}: {len(hyps)} sentences, beam {k}, {seconds:.1f} s ({len(hyps) / max(seconds, 1e-9):.1f} "
              f"sentences/s); hypotheses in {out_path}")
        for key, s in scores.items():
            print(f"{key:8s} {s.score:6.2f}  {s.signature}")
    if show:
        print(check_outputs(src_lines, ref_lines, hyps, n=show), file=sys.stderr if as_json else sys.stdout)
    return result


def average_to(paths: list[str], output: str) -> int:
    """Average checkpoints' parameters into `output` (written atomically)."""
    if not paths:
        raise CheckpointError("give at least one checkpoint to average")
    out = Path(output)
    if out.suffix != ".pt":
        raise ConfigError(f"--output should be a .pt file, got {output}")
    payload = average_checkpoints(paths)
    save_checkpoint(payload, out)
    print(f"averaged {len(paths)} checkpoints into {out}")
    return 0
