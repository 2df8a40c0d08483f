"""The tokenised-data cache: every split tokenised and numericalised once, kept on disk.

    <data.cache_dir>/<data.dataset>-<key>/     multi30k-<key>, or files-<key> for your own files
        text/                 the TextPipeline (vocabularies or SentencePiece model), TextPipeline.save format
        train.src.ids.npy     per split and side: every sentence's ids (<s> ... </s>, untruncated) back to back,
        train.src.offsets.npy   and where each starts (int64, one more than sentences): RaggedIds (ids.py)
        ...                   (train.tgt.*, val.*, test.*)
        val.refs.json         word mode: val and test targets as BLEU compares them (spaCy tokens joined by
        test.refs.json        spaces), so a machine without spaCy scores BLEU from the cache
        manifest.json         the settings the key was made from, the build statistics, each file's sha256

The id files are plain .npy arrays, uint16 where the vocabulary fits in 65,536 ids (every spm
vocabulary the configs use) and int32 otherwise: half the disk and half the memory the operating
system pages in. Reading maps them (`np.load(mmap_mode="r")`) instead of loading them, as fairseq's
binarised datasets do: a process holds the offsets, and the pages of ids a batch reads; a million
sentences are not a million arrays. Building appends to them a chunk of sentences at a time
(`CacheWriter`), so no split is ever whole in memory either.

The key is a hash of everything that changes the ids: the data checksums (Multi30k's published
ones, or the sha256 of each of your own files), the languages, the tokenisation settings, the
tokeniser versions, the format version, and, when SentencePiece learns from a sample of a large
corpus (data.spm_sample), the sample's size and seed. The ids are stored untruncated:
data.max_sentence_len and data.long_policy are applied when loading, so changing them does not
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
import io
import json
import os
import re
import secrets
import shutil
import socket
import struct
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..runtime.errors import DataError, excerpt
from ..runtime.files import give_default_permissions
from .ids import RaggedIds
from .multi30k import MULTI30K_FILES, sha256_file
from .text import TextFileDamaged, TextFileUnreadable, TextPipeline

CACHE_FORMAT = 2  # 2: flat memory-mapped .npy id files (1: one .npz a split; unchanged by the checksums)
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
        """'FILE: why', FILE relative to the cache `folder` (text/vocab.src.json, train.src.ids.npy)."""
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


def spm_sample_setting(data_cfg: Any, train_pairs: int, seed: int | None) -> dict[str, int] | None:
    """{'sentences': data.spm_sample, 'seed': seed} when SentencePiece learns from a sample of the training split
    (spm mode, and more sentences, both sides counted, than data.spm_sample); None when it reads every sentence."""
    d = data_cfg
    if d.tokenizer != "spm" or not d.spm_sample or 2 * train_pairs <= d.spm_sample:
        return None
    if seed is None:
        raise ValueError(f"a training split of {train_pairs} pairs is sampled for SentencePiece "
                         f"(data.spm_sample={d.spm_sample}): its seed (train.seed) is needed")
    return {"sentences": int(d.spm_sample), "seed": int(seed)}


def cache_settings(data_cfg: Any, fingerprint: dict[str, str] | None = None,
                   sample: dict[str, int] | None = None) -> dict[str, Any]:
    """What the cached ids depend on (only the settings of the active tokenizer); `fingerprint` identifies the
    data files (the corpus's `fingerprint()`; Multi30k's checksums when None); `sample` is `spm_sample_setting`'s,
    in the key only when there is one, so a corpus smaller than the sample has one cache for every seed."""
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
        if sample is not None:
            settings["spm_sample"] = dict(sample)
    return settings


def corpus_settings(data_cfg: Any, corpus: Any, seed: int | None = None) -> dict[str, Any]:
    """`cache_settings` of `corpus` (a Multi30k or OwnFiles: its files' sha256, every file streamed and checked) and
    of SentencePiece's sample of a training split larger than data.spm_sample, drawn with `seed` (train.seed): what
    names the corpus's cache, and what a resume compares."""
    return cache_settings(data_cfg, corpus.fingerprint(), spm_sample_setting(data_cfg, corpus.count("train"), seed))


def cache_key(settings: dict[str, Any]) -> str:
    """A short stable hash of `settings`."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def cache_folder(data_cfg: Any, settings: dict[str, Any] | None = None) -> Path:
    """The cache folder of `settings` (`cache_settings`'s; Multi30k's files when None), named after data.dataset:
    multi30k-KEY, files-KEY."""
    key = cache_key(cache_settings(data_cfg) if settings is None else settings)
    return Path(data_cfg.cache_dir).expanduser() / f"{data_cfg.dataset}-{key}"


def find_cache_folder(data_cfg: Any, settings: dict[str, Any]) -> Path:
    """The cache folder to read: `cache_folder`, or, where spaCy is not installed (a machine that trains
    from a cache prepared elsewhere), the newest complete word-mode cache of the same settings built
    with any spaCy version. A cache found that way is only read: without spaCy none can be built."""
    folder = cache_folder(data_cfg, settings)
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


def ids_dtype(vocab_size: int) -> np.dtype:
    """The dtype of a cache's ids: uint16 where every id of a `vocab_size` vocabulary fits, else int32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def ids_files(split: str, side: str) -> tuple[str, str]:
    """The names of one split side's two files in a cache folder: its ids and its offsets."""
    return f"{split}.{side}.ids.npy", f"{split}.{side}.offsets.npy"


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


class _NpyAppender:
    """A 1-D .npy file written a piece at a time: its header, written first for length 0, is rewritten at `close`
    with the final length (NumPy pads the header for that: its size does not change)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.size = path, np.dtype(dtype), 0
        self.file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.header = self._header()
        self.file.write(self.header)

    def _header(self) -> bytes:
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                      "fortran_order": False, "shape": (self.size,)})
        return buffer.getvalue()

    def append(self, values: np.ndarray) -> None:
        """Write `values` (cast to the file's dtype) after what is there."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(values.data)
        self.size += values.size

    def close(self) -> None:
        """The header says the final length; the file is on the disk."""
        header = self._header()
        if len(header) != len(self.header):  # cannot happen with NumPy's padding; a wrong file must not be kept
            raise ValueError(f"{self.path}: the .npy header changed size ({len(self.header)} -> {len(header)} bytes)")
        self.file.seek(0)
        self.file.write(header)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


class IdsWriter:
    """One side of one split in a cache being built, appended a chunk of sentences at a time: the ids back to back
    (SPLIT.SIDE.ids.npy) and the offset where each sentence starts (SPLIT.SIDE.offsets.npy, int64)."""

    def __init__(self, folder: Path, split: str, side: str, dtype: np.dtype) -> None:
        ids_name, offsets_name = ids_files(split, side)
        self.ids = _NpyAppender(folder / ids_name, dtype)
        self.offsets = _NpyAppender(folder / offsets_name, np.dtype(np.int64))
        self.offsets.append(np.zeros(1, dtype=np.int64))
        self.sentences = self.longest = 0

    def append(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Sentences whose ids are `flat`, back to back, `lengths` of them each."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != flat.size:
            raise ValueError(f"{lengths.size} sentences of {int(lengths.sum())} ids in total, given {flat.size} ids")
        self.ids.append(flat)
        self.offsets.append(self.ids.size - flat.size + np.cumsum(lengths))
        self.sentences += lengths.size
        self.longest = max(self.longest, int(lengths.max(initial=0)))

    def append_rows(self, rows: list[list[int]]) -> None:
        """Sentences given as lists of ids (a small split)."""
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        self.append(np.fromiter((i for r in rows for i in r), dtype=self.ids.dtype, count=int(lengths.sum())),
                    lengths)

    def close(self) -> None:
        """Both files complete on the disk."""
        self.ids.close()
        self.offsets.close()


class CacheWriter:
    """A cache folder being built: a temporary of this process (`.FOLDER.HOST.PID.RANDOM.tmp`), filled split by
    split, renamed to `folder` by `finish` once whole; removed when the build stops before that.

        with CacheWriter(folder) as cache:
            ids = cache.ids("train", "src", dtype); ids.append(flat, lengths); ids.close()
            cache.finish(text, settings, stats)
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tmp: Path | None = None
        self.splits: list[str] = []

    def __enter__(self) -> CacheWriter:
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temporaries(self.folder.parent)
        self.tmp = Path(tempfile.mkdtemp(dir=self.folder.parent, prefix=_temporary_prefix(self.folder),
                                         suffix=".tmp"))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def path(self) -> Path:
        """The temporary folder the files go to."""
        if self.tmp is None:
            raise RuntimeError("CacheWriter is used in a with block")
        return self.tmp

    def ids(self, split: str, side: str, dtype: np.dtype) -> IdsWriter:
        """The writer of one side of `split` (the split is listed in the manifest)."""
        if split not in self.splits:
            self.splits.append(split)
        return IdsWriter(self.path, split, side, dtype)

    def refs(self, split: str, refs: list[str]) -> None:
        """Word mode: `split`'s targets as BLEU compares them."""
        (self.path / f"{split}.refs.json").write_text(json.dumps(refs, ensure_ascii=False), encoding="utf-8")

    def finish(self, text: TextPipeline, settings: dict[str, Any], stats: dict[str, Any]) -> Path:
        """Save the text pipeline and the manifest (every file's sha256), then rename the folder into place."""
        tmp = self.path
        text.save(tmp / "text")
        checksums = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"settings": settings, "stats": stats, "splits": sorted(self.splits), "checksums": checksums}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        give_default_permissions(tmp)  # a shared cache_dir stays shared
        try:
            os.rename(tmp, self.folder)
        except OSError:
            if not (self.folder / MANIFEST).is_file():
                raise
            # Another process finished the same cache first; its folder is identical to ours.
        return self.folder


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


# What a file that does not parse raises: numpy's errors (a bad header, a file shorter than its header says), a
# missing value (KeyError), an OSError without an errno; an OSError with one is the disk's or the permissions'.
_PARSE_ERRORS = (ValueError, EOFError, KeyError, TypeError, IndexError, struct.error)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CacheUnreadable(path, "missing") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CacheUnreadable(path, f"not valid JSON: {excerpt(exc, 100)}") from None


def _mapped(path: Path) -> np.ndarray:
    """A 1-D integer .npy file of the cache, memory-mapped read-only; CacheUnreadable when it does not parse or its
    size is not the one its header gives."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise CacheUnreadable(path, f".npy format {version}, where this cache writes (1, 0)")
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            start, size = f.tell(), os.fstat(f.fileno()).st_size
        if len(shape) != 1 or dtype.kind not in "iu":
            raise CacheUnreadable(path, f"not a 1-D array of integers ({dtype}, shape {shape})")
        if size != start + shape[0] * dtype.itemsize:
            raise CacheUnreadable(path, f"cut short or padded: {size} bytes, where its header says "
                                        f"{start + shape[0] * dtype.itemsize}")
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise CacheUnreadable(path, "missing") from None
    except OSError as exc:
        if exc.errno is not None:
            raise
        raise CacheUnreadable(path, excerpt(exc, 100)) from None
    except _PARSE_ERRORS as exc:
        raise CacheUnreadable(path, f"{type(exc).__name__}: {excerpt(exc, 100)}") from None


def _read_side(folder: Path, split: str, side: str, rows: int | None) -> RaggedIds:
    """One side of a split, mapped, its offsets checked against its ids and the manifest's count of sentences."""
    ids_name, offsets_name = ids_files(split, side)
    flat, offsets = _mapped(folder / ids_name), _mapped(folder / offsets_name)
    path = folder / offsets_name
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] != flat.size or np.any(np.diff(offsets) < 0):
        raise CacheUnreadable(path, f"its offsets do not fit the {flat.size} ids of {ids_name} (cut short?)")
    if rows is not None and offsets.size - 1 != rows:
        raise CacheUnreadable(path, f"it holds {offsets.size - 1} sentences, manifest.json says {rows}")
    return RaggedIds(flat, offsets)


def _read_split(folder: Path, name: str, rows: int | None) -> dict[str, Any]:
    src = _read_side(folder, name, "src", rows)
    split: dict[str, Any] = {"src": src, "tgt": _read_side(folder, name, "tgt", len(src))}
    refs_path = folder / f"{name}.refs.json"
    refs = _read_json(refs_path) if refs_path.is_file() else None
    if refs is not None and (not isinstance(refs, list) or len(refs) != len(src)
                             or not all(isinstance(r, str) for r in refs)):
        raise CacheUnreadable(refs_path, f"not a list of {len(src)} references")
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

    `splits[name]` = {'src': RaggedIds, 'tgt': RaggedIds, 'refs': [str] or None}, one sentence per raw line,
    the ids memory-mapped from the cache's files.
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
