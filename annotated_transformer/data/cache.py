"""The tokenised-data cache: every split tokenised and numericalised once, kept on disk.

    <data.cache_dir>/<data.dataset>-<key>/     multi30k-<key>, or files-<key> for your own files
        text/            the TextPipeline (vocabularies or SentencePiece model), TextPipeline.save format
        train.npz ...    per split: concatenated ids (<s> ... </s>, untruncated) + offsets, for each side
        val.refs.json    word mode: val and test targets as BLEU compares them (spaCy tokens joined by
        test.refs.json   spaces), so a machine without spaCy scores BLEU from the cache
        manifest.json    the settings the key was made from, and the build statistics

The key is a hash of everything that changes the ids: the data checksums (Multi30k's published
ones, or the sha256 of each of your own files), the languages, the tokenisation settings, the
tokeniser versions and the format version. The ids are stored untruncated: data.max_sentence_len
and data.long_policy are applied when loading (a few milliseconds), so changing them does not
tokenise everything again. A cache folder is built under a temporary name and renamed into place
when complete, so a folder with the final name is always whole; two processes building at once
both produce the same folder and one rename wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.files import give_default_permissions
from .multi30k import MULTI30K_FILES
from .text import TextPipeline

CACHE_FORMAT = 1
MANIFEST = "manifest.json"


class CacheUnreadable(Exception):
    """A cache folder exists but cannot be read back (it is rebuilt)."""


ABSENT = "absent"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # a machine that only trains from a prepared cache
        return ABSENT


def cache_settings(data_cfg: Any, fingerprint: dict[str, str] | None = None) -> dict[str, Any]:
    """What the cached ids depend on (only the settings of the active tokenizer); `fingerprint` identifies the
    data files (the corpus's `fingerprint()`; Multi30k's checksums when None)."""
    d = data_cfg
    data = dict(sorted(MULTI30K_FILES.items())) if fingerprint is None else fingerprint
    settings: dict[str, Any] = {
        "format": CACHE_FORMAT, "data": data, "src_lang": d.src_lang,
        "tgt_lang": d.tgt_lang, "tokenizer": d.tokenizer, "lowercase": bool(d.lowercase),
    }
    if d.tokenizer == "word":
        settings.update(min_freq=int(d.min_freq), spacy=_version("spacy"), references="tokenised")
    else:
        settings.update(spm_vocab_size=int(d.spm_vocab_size), sentencepiece=_version("sentencepiece"))
    return settings


def cache_key(settings: dict[str, Any]) -> str:
    """A short stable hash of `settings`."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def cache_folder(data_cfg: Any, fingerprint: dict[str, str] | None = None) -> Path:
    """The cache folder of these data settings and files (named after data.dataset: multi30k-KEY, files-KEY)."""
    key = cache_key(cache_settings(data_cfg, fingerprint))
    return Path(data_cfg.cache_dir).expanduser() / f"{data_cfg.dataset}-{key}"


def find_cache_folder(data_cfg: Any, fingerprint: dict[str, str] | None = None) -> Path:
    """The cache folder to read: `cache_folder`, or, where spaCy is not installed (a machine that trains
    from a cache prepared elsewhere), the newest complete word-mode cache of the same settings built
    with any spaCy version. A cache found that way is only read: without spaCy none can be built."""
    folder = cache_folder(data_cfg, fingerprint)
    settings = cache_settings(data_cfg, fingerprint)
    if data_cfg.tokenizer != "word" or settings["spacy"] != ABSENT or (folder / MANIFEST).is_file():
        return folder
    want = {k: v for k, v in settings.items() if k != "spacy"}
    found = []
    for manifest in folder.parent.glob(f"{data_cfg.dataset}-*/{MANIFEST}"):
        try:
            got = json.loads(manifest.read_text(encoding="utf-8"))["settings"]
            if {k: v for k, v in got.items() if k != "spacy"} == want:
                found.append(manifest.parent)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # unreadable or foreign: not a candidate
    return max(found, key=lambda p: p.stat().st_mtime, default=folder)


def _pack(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((i for r in rows for i in r), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def _unpack(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    # int64 once for the whole split: the ids feed embedding lookups, which need int64.
    return np.split(flat.astype(np.int64), offsets[1:-1])


def write_cache(folder: Path, text: TextPipeline, splits: dict[str, dict[str, Any]], settings: dict[str, Any],
                stats: dict[str, Any]) -> Path:
    """Write a complete cache folder atomically. `splits[name]` = {'src': rows, 'tgt': rows} (+ 'refs': lines)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        text.save(tmp / "text")
        for name, sp in splits.items():
            src_flat, src_off = _pack(sp["src"])
            tgt_flat, tgt_off = _pack(sp["tgt"])
            with open(tmp / f"{name}.npz", "wb") as f:
                np.savez(f, src=src_flat, src_offsets=src_off, tgt=tgt_flat, tgt_offsets=tgt_off)
                f.flush()
                os.fsync(f.fileno())
            if sp.get("refs") is not None:
                (tmp / f"{name}.refs.json").write_text(json.dumps(sp["refs"], ensure_ascii=False), encoding="utf-8")
        manifest = {"settings": settings, "stats": stats, "splits": sorted(splits)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        give_default_permissions(tmp)  # a shared cache_dir stays shared
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / MANIFEST).is_file():
                raise
            # Another process finished the same cache first; its folder is identical to ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def read_cache(folder: Path) -> tuple[TextPipeline, dict[str, dict[str, Any]], dict[str, Any]] | None:
    """(text pipeline, splits, build stats) from a cache folder; None if absent; CacheUnreadable if damaged.

    `splits[name]` = {'src': [np.ndarray], 'tgt': [np.ndarray], 'refs': [str] or None}, one entry per raw line.
    """
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        text = TextPipeline.load(folder / "text")
        splits = {}
        for name in manifest["splits"]:
            with np.load(folder / f"{name}.npz") as z:
                splits[name] = {"src": _unpack(z["src"], z["src_offsets"]), "tgt": _unpack(z["tgt"], z["tgt_offsets"])}
            refs = folder / f"{name}.refs.json"
            splits[name]["refs"] = json.loads(refs.read_text(encoding="utf-8")) if refs.is_file() else None
        return text, splits, manifest["stats"]
    except Exception as exc:  # any damage at all means: do not trust it, rebuild
        raise CacheUnreadable(f"{type(exc).__name__}: {exc}") from exc
