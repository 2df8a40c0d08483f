"""The tokenised-data cache: every split tokenised and numericalised once, kept on disk.

    <data.cache_dir>/<data.dataset>-<key>/     multi30k-<key>, or files-<key> for your own files
        text/            the TextPipeline (vocabularies or SentencePiece model), TextPipeline.save format
        train.npz ...    per split: concatenated ids (<s> ... </s>, untruncated) + offsets, for each side
        val.refs.json    word mode: val and test targets as BLEU compares them (spaCy tokens joined by
        test.refs.json   spaces), so a machine without spaCy scores BLEU from the cache
        manifest.json    the settings the key was made from, the build statistics, each file's sha256

The key is a hash of everything that changes the ids: the data checksums (Multi30k's published
ones, or the sha256 of each of your own files), the languages, the tokenisation settings, the
tokeniser versions and the format version. The ids are stored untruncated: data.max_sentence_len
and data.long_policy are applied when loading (a few milliseconds), so changing them does not
tokenise everything again. A cache folder is built under a temporary name and renamed into place
when complete, so a folder with the final name is always whole; two processes building at once
both produce the same folder and one rename wins. The temporary's name says which host and process
own it (`.multi30k-KEY.HOST.PID.RANDOM.tmp`): a later build removes those of processes gone from this
host (a killed build's), never a live one's.

A cache is rebuilt only when it is proven damaged: a file that does not parse, an array missing or
cut short, a file whose sha256 is not the one manifest.json recorded (caches written before the
checksums read without that check). Anything else, a MemoryError or an OSError such as a permission
denied, is one DataError line and the cache stays as it is: another run may be reading it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import struct
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.errors import DataError, excerpt
from ..runtime.files import give_default_permissions
from .multi30k import MULTI30K_FILES, sha256_file
from .text import TextFileDamaged, TextFileUnreadable, TextPipeline

CACHE_FORMAT = 1  # unchanged by the checksums: a manifest without them still reads, nobody tokenises again
MANIFEST = "manifest.json"
# A temporary of this module: .FOLDER.HOST.PID.RANDOM.tmp (a cache being written, or a damaged one being deleted).
TEMPORARY = re.compile(r"^\.(?P<folder>[a-z0-9]+-[0-9a-f]{16})\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>[0-9]+)"
                       r"\.[a-z0-9_]+\.tmp$")
DEAD_AFTER_S = 3600  # and untouched this long: a process of another pid namespace (a container) may share the host


class CacheUnreadable(Exception):
    """A cache folder is proven damaged (`path` does not parse, is cut short, or fails its checksum): it is rebuilt."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason

    def within(self, folder: Path) -> str:
        """'FILE: why', FILE relative to the cache `folder` (text/vocab.src.json, train.npz)."""
        try:
            return f"{self.path.relative_to(folder).as_posix()}: {self.reason}"
        except ValueError:
            return str(self)


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


def _host() -> str:
    """This machine's name as a temporary's name carries it (letters, digits, '-' and '_' only)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "host"


def _temporary_prefix(folder: Path) -> str:
    return f".{folder.name}.{_host()}.{os.getpid()}."


def _process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host; where that cannot be told (not POSIX), it counts as running."""
    if pid == os.getpid():
        return True
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process, alive
        return True
    return True


def remove_dead_temporaries(cache_dir: Path, now: float | None = None) -> list[Path]:
    """Delete this module's temporaries in `cache_dir` whose process is gone from this host (a killed build's);
    those of live processes, of other hosts, or touched in the last `DEAD_AFTER_S` seconds stay. The removed."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(cache_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = TEMPORARY.match(entry.name)
        if not match or match["host"] != _host() or _process_alive(int(match["pid"])):
            continue
        try:
            if entry.is_symlink() or not entry.is_dir() or now - entry.stat().st_mtime < DEAD_AFTER_S:
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def write_cache(folder: Path, text: TextPipeline, splits: dict[str, dict[str, Any]], settings: dict[str, Any],
                stats: dict[str, Any]) -> Path:
    """Write a complete cache folder atomically. `splits[name]` = {'src': rows, 'tgt': rows} (+ 'refs': lines)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(folder.parent)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=_temporary_prefix(folder), suffix=".tmp"))
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
        checksums = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"settings": settings, "stats": stats, "splits": sorted(splits), "checksums": checksums}
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


def discard_cache(folder: Path) -> None:
    """Delete a damaged cache folder: renamed first to a temporary of this process (a run reading it keeps its open
    files; a build finds the name free), then removed; if this process dies meanwhile, a later build removes it."""
    aside = folder.parent / f"{_temporary_prefix(folder)}{secrets.token_hex(4)}.tmp"
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return  # another process discarded it first
    except OSError as exc:
        raise DataError(f"the data cache {folder} is damaged and cannot be removed ({exc.strerror or exc}); delete "
                        "it, or set data.cache_dir to another folder") from None
    shutil.rmtree(aside, ignore_errors=True)


# What a file that does not parse raises: numpy's and zipfile's errors, a missing array (KeyError), an OSError
# without an errno (numpy's "cannot interpret"); an OSError with one is the disk's or the permissions' problem.
_PARSE_ERRORS = (ValueError, EOFError, KeyError, TypeError, IndexError, struct.error, zipfile.BadZipFile)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CacheUnreadable(path, "missing") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CacheUnreadable(path, f"not valid JSON: {excerpt(exc, 100)}") from None


def _checked_ids(path: Path, z: Any, side: str, rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One side's ids and offsets from an open .npz, each array checked against the other and the manifest."""
    flat, offsets = z[side], z[f"{side}_offsets"]
    if flat.ndim != 1 or offsets.ndim != 1 or offsets.size == 0 or flat.dtype.kind not in "iu" \
            or offsets.dtype.kind not in "iu":
        raise CacheUnreadable(path, f"its {side} arrays are not 1-D integers")
    if offsets[0] != 0 or offsets[-1] != flat.size or (offsets.size > 1 and np.any(np.diff(offsets) < 0)):
        raise CacheUnreadable(path, f"its {side} offsets do not fit its {flat.size} ids (cut short?)")
    if rows is not None and offsets.size - 1 != rows:
        raise CacheUnreadable(path, f"it holds {offsets.size - 1} {side} sentences, manifest.json says {rows}")
    return flat, offsets


def _read_split(folder: Path, name: str, rows: int | None) -> dict[str, Any]:
    path = folder / f"{name}.npz"
    try:
        with np.load(path) as z:
            src, src_off = _checked_ids(path, z, "src", rows)
            tgt, tgt_off = _checked_ids(path, z, "tgt", src_off.size - 1)
            split = {"src": _unpack(src, src_off), "tgt": _unpack(tgt, tgt_off)}
    except FileNotFoundError:
        raise CacheUnreadable(path, "missing") from None
    except OSError as exc:
        if exc.errno is not None:
            raise
        raise CacheUnreadable(path, excerpt(exc, 100)) from None
    except _PARSE_ERRORS as exc:
        raise CacheUnreadable(path, f"{type(exc).__name__}: {excerpt(exc, 100)}") from None
    refs_path = folder / f"{name}.refs.json"
    refs = _read_json(refs_path) if refs_path.is_file() else None
    if refs is not None and (not isinstance(refs, list) or len(refs) != len(split["src"])
                             or not all(isinstance(r, str) for r in refs)):
        raise CacheUnreadable(refs_path, f"not a list of {len(split['src'])} references")
    split["refs"] = refs
    return split


def _read_checked(folder: Path) -> tuple[TextPipeline, dict[str, dict[str, Any]], dict[str, Any]]:
    """`read_cache`'s work: every file checked; CacheUnreadable for a damaged one, an OSError or MemoryError raised."""
    manifest_path = folder / MANIFEST
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("stats"), dict) \
            or not isinstance(manifest.get("splits"), list) or not all(isinstance(n, str) for n in manifest["splits"]) \
            or not isinstance(manifest.get("checksums", {}), dict):
        raise CacheUnreadable(manifest_path, "not the manifest this cache writes")
    for name, digest in manifest.get("checksums", {}).items():  # caches written before the checksums have none
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CacheUnreadable(manifest_path, f"it names {name!r}, outside the cache")
        try:
            if sha256_file(path) != digest:
                raise CacheUnreadable(path, "its sha256 is not the one manifest.json recorded")
        except FileNotFoundError:
            raise CacheUnreadable(path, "missing") from None
    try:
        text = TextPipeline.load(folder / "text")
    except TextFileDamaged as exc:
        raise CacheUnreadable(exc.path, exc.reason) from None
    except TextFileUnreadable as exc:
        raise exc.error from None
    raw_lines = manifest["stats"].get("raw_lines")
    rows = raw_lines if isinstance(raw_lines, dict) else {}
    splits = {name: _read_split(folder, name, rows.get(name)) for name in manifest["splits"]}
    return text, splits, manifest["stats"]


def read_cache(folder: Path) -> tuple[TextPipeline, dict[str, dict[str, Any]], dict[str, Any]] | None:
    """(text pipeline, splits, build stats) from a cache folder; None if absent; CacheUnreadable if proven damaged;
    a DataError line (the cache left as it is) for what is not the cache's fault: memory, permissions, the disk.

    `splits[name]` = {'src': [np.ndarray], 'tgt': [np.ndarray], 'refs': [str] or None}, one entry per raw line.
    """
    if not (folder / MANIFEST).is_file():
        return None
    try:
        return _read_checked(folder)
    except MemoryError:
        raise DataError(f"not enough memory to read the data cache {folder}; free some memory (other programs) and "
                        "run again, or set data.cache_dir to another folder") from None
    except OSError as exc:
        where = Path(exc.filename).name if exc.filename else folder.name
        raise DataError(f"cannot read the data cache {folder} ({where}: {exc.strerror or exc}); check its "
                        "permissions and the disk, or set data.cache_dir to another folder") from None
