"""Your own parallel text: each split is two files, PREFIX.SRC_LANG and PREFIX.TGT_LANG, one sentence a line.

    data:
      dataset: files
      train: corpus/train      # corpus/train.fr and corpus/train.en (or .fr.gz / .en.gz)
      val: corpus/val
      test: corpus/test        # optional
      src_lang: fr
      tgt_lang: en

The naming is fairseq's and JoeyNMT's (and Multi30k's own: train.de.gz, train.en.gz). Every file is
read as UTF-8, plain or gzip-compressed, and checked before anything is tokenised or cached: a
missing, empty or non-UTF-8 file, or two files of a split whose line counts differ, is one DataError
line that names the file. The check streams each file once (its sha256, its lines counted, its
bytes decoded), so a corpus of millions of lines is never whole in memory; tokenising streams it
again, a chunk of lines at a time (`file_chunks`). The sha256 of every file's bytes keys the data
cache, so different files never share a cache entry, and the same files moved elsewhere still find
theirs.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..runtime.errors import DataError
from ..runtime.files import not_gzip, not_utf8

SPLIT_KEYS = ("train", "val", "test")  # the config keys data.train, data.val, data.test, in this order


def split_lines(text: str) -> list[str]:
    """The lines of a file's text, each stripped of surrounding whitespace; a final newline ends the last line."""
    # Split on '\n' only: str.splitlines would also break at characters like U+2028 inside a
    # sentence and misalign the two languages. '\r' of Windows line endings goes with the strip.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def find_file(prefix: str, lang: str, key: str) -> Path:
    """PREFIX.LANG, else PREFIX.LANG.gz (`key` is the config key naming the prefix, for the message)."""
    base = Path(prefix).expanduser()
    plain, packed = base.with_name(f"{base.name}.{lang}"), base.with_name(f"{base.name}.{lang}.gz")
    try:
        found = [path for path in (plain, packed) if path.is_file()]
    except OSError as exc:  # a folder on the way that may not be read
        raise DataError(f"{key}={prefix}: cannot look for {plain} ({exc.strerror or exc}); check the folder's "
                        "permissions") from None
    if len(found) == 2:
        raise DataError(f"{key}={prefix} names both {plain} and {packed}; remove one of them")
    if found:
        return found[0]
    hint = f"check the path (relative paths start from {Path.cwd()})"
    if str(prefix).endswith("/") or base.is_dir():  # a folder: the prefix names files inside it
        example = base / key.rpartition(".")[2]
        hint = f"{key} is the files' prefix, not their folder: e.g. {key}={example} for {example}.{lang}"
    elif base.name.endswith((f".{lang}", f".{lang}.gz")):  # the language code given twice
        bare = base.name.removesuffix(".gz").removesuffix(f".{lang}")
        hint = f"the prefix leaves out the language code: {key}={base.with_name(bare)}"
    raise DataError(f"{key}={prefix} needs the file {plain} (or {packed.name}), which does not exist; {hint}")


CHUNK_BYTES = 1 << 24  # text read at a time: about 16 MB, some 120,000 sentences of WMT length


class _Hashed:
    """A binary file that shows every byte read from it to a sha256 (a gzip reader reads through it)."""

    def __init__(self, raw: BinaryIO, digest: Any) -> None:
        self.raw, self.digest = raw, digest

    def read(self, size: int = -1) -> bytes:
        block = self.raw.read(size)
        self.digest.update(block)
        return block


def _read_bytes(stream: Any, size: int, path: Path) -> bytes:
    """Up to `size` bytes of the (decompressed) file; a broken gzip stream or a failing read is one DataError."""
    try:
        return stream.read(size)
    except (EOFError, zlib.error) as exc:
        problem = exc
    except OSError as exc:
        if exc.errno is not None:  # the disk's or the permissions' problem, not the file's content
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        problem = exc  # gzip.BadGzipFile
    raise DataError(not_gzip(path, problem))


def _text_blocks(path: Path, digest: Any = None, chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """The text of a plain or gzip-compressed UTF-8 file, in blocks of about `chunk_bytes` that end where a line
    ends (the last may not), a byte-order mark dropped; `digest` (a hashlib object) sees every byte of the file.
    DataError when the file cannot be read or is not UTF-8."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the with below, the gzip reader inside it
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    with raw:
        source: Any = raw if digest is None else _Hashed(raw, digest)
        stream = gzip.GzipFile(fileobj=source, mode="rb") if path.suffix == ".gz" else source
        lines_before, carry, first = 0, b"", True
        while True:
            data = _read_bytes(stream, chunk_bytes, path)
            if data:
                data = carry + data
                # Cut after the last newline: a block never splits a line, nor a UTF-8 character ('\n' is
                # never part of one). A line longer than the block waits for the next read.
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
                block, carry = data[:cut], data[cut:]
            elif carry:
                block, carry = carry, b""
            else:
                break
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = lines_before + block[: exc.start].count(b"\n") + 1
                raise DataError(not_utf8(path, line, block[exc.start])) from None
            lines_before += text.count("\n")
            if first:  # a byte-order mark is not part of the first sentence
                text, first = text.removeprefix("\ufeff"), False
            yield text
        if digest is not None:
            while source.read(1 << 20):  # whatever the gzip reader left unread still belongs to the file's sha256
                pass


def _line_count(text: str) -> int:
    """How many lines `split_lines` makes of a block of text."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _empty(path: Path) -> DataError:
    return DataError(f"{path} is empty: give a file with sentences, one a line")


@dataclass(frozen=True)
class FileFacts:
    """What checking a file found: the sha256 of its bytes and its number of lines."""

    sha256: str
    lines: int


def check_file(path: Path, chunk_bytes: int = CHUNK_BYTES) -> FileFacts:
    """Stream one plain or gzip-compressed file once: its sha256 and line count, checked to be non-empty UTF-8
    text (DataError otherwise); only a block of about `chunk_bytes` is in memory at a time."""
    digest = hashlib.sha256()
    lines, has_text = 0, False
    for text in _text_blocks(path, digest, chunk_bytes):
        lines += _line_count(text)
        has_text = has_text or bool(text.strip())  # some line holds more than whitespace
    if not has_text:
        raise _empty(path)
    return FileFacts(digest.hexdigest(), lines)


def file_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[str]]:
    """The lines of a file as `split_lines` makes them, a chunk of about `chunk_bytes` at a time."""
    for text in _text_blocks(path, chunk_bytes=chunk_bytes):
        lines = split_lines(text)
        if lines:
            yield lines


def picked_lines(chunks: Iterable[list[str]], rows: np.ndarray) -> Iterator[str]:
    """The lines whose numbers the sorted `rows` name, in one pass over a file's `chunks`."""
    start = 0
    for lines in chunks:
        stop = start + len(lines)
        low, high = np.searchsorted(rows, (start, stop))
        for row in rows[low:high]:
            yield lines[row - start]
        start = stop


def read_file(path: Path) -> tuple[list[str], str]:
    """(lines, sha256 of the file's bytes) of one plain or gzip-compressed UTF-8 file, whole; DataError when
    unusable. For small files (a validation split, a file to score): a corpus streams with `file_chunks`."""
    digest = hashlib.sha256()
    lines = [line for text in _text_blocks(path, digest) for line in split_lines(text)]
    if not any(lines):
        raise _empty(path)
    return lines, digest.hexdigest()


def _unequal(src_path: Path, src_lines: int, tgt_path: Path, tgt_lines: int) -> DataError:
    return DataError(f"{src_path} has {src_lines} lines but {tgt_path} has {tgt_lines}: line i of one must be the "
                     "translation of line i of the other; fix the files so they pair up")


@dataclass(eq=False)
class OwnFiles:
    """Your parallel corpus: each split's (source, target) files, checked on first use, streamed when tokenised."""

    files: dict[str, tuple[Path, Path]]  # split -> (source file, target file)
    src_lang: str
    tgt_lang: str
    name: str = "your files"  # how the log names the corpus
    _facts: dict[str, tuple[FileFacts, FileFacts]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, d: Any, splits: Sequence[str] = SPLIT_KEYS) -> OwnFiles:
        """The files data.train / data.val / data.test name; every one must exist (they are read later). `splits`:
        only these (scoring one split needs its two files, not the training data)."""
        files = {}
        for split in splits:
            prefix = getattr(d, split)
            if prefix:
                files[split] = (find_file(prefix, d.src_lang, f"data.{split}"),
                                find_file(prefix, d.tgt_lang, f"data.{split}"))
        # validate() says this first; here for a Config built by hand (a training corpus, not one split of it)
        if tuple(splits) == SPLIT_KEYS and ("train" not in files or "val" not in files):
            raise DataError("data.dataset=files needs data.train and data.val (the prefixes of the training and "
                            "validation files)")
        return cls(files, d.src_lang, d.tgt_lang)

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits there are files for: train, val, and test when data.test is set."""
        return tuple(self.files)

    @property
    def location(self) -> str:
        """Where the training files are (for the log and the statistics)."""
        return str(self.files["train"][0].parent)

    def paths(self, split: str) -> tuple[Path, Path]:
        """The source and target file of `split`."""
        if split not in self.files:
            raise DataError(f"there is no {split} split: set data.{split} to the prefix of its files")
        return self.files[split]

    def check(self, split: str) -> tuple[FileFacts, FileFacts]:
        """Both files of `split` streamed once and checked (UTF-8, not empty, as many lines as each other); the
        facts are remembered."""
        if split not in self._facts:
            src_path, tgt_path = self.paths(split)
            src, tgt = check_file(src_path), check_file(tgt_path)
            if src.lines != tgt.lines:
                raise _unequal(src_path, src.lines, tgt_path, tgt.lines)
            self._facts[split] = (src, tgt)
        return self._facts[split]

    def count(self, split: str) -> int:
        """The number of sentence pairs of `split` (its files checked first)."""
        return self.check(split)[0].lines

    def read(self, split: str) -> tuple[list[str], list[str]]:
        """The aligned source and target lines of `split`, checked, whole (val and test; not kept here)."""
        src_path, tgt_path = self.paths(split)
        (src, _), (tgt, _) = read_file(src_path), read_file(tgt_path)
        if len(src) != len(tgt):
            raise _unequal(src_path, len(src), tgt_path, len(tgt))
        return src, tgt

    def chunks(self, split: str, side: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[str]]:
        """The lines of one side ('src' or 'tgt') of `split`, a chunk at a time (its files checked first)."""
        self.check(split)
        return file_chunks(self.paths(split)[("src", "tgt").index(side)], chunk_bytes)

    def fingerprint(self) -> dict[str, str]:
        """The sha256 of every file by split and language (every file is streamed and checked first)."""
        digests = {}
        for split in self.splits:
            src, tgt = self.check(split)
            digests[f"{split}.{self.src_lang}"], digests[f"{split}.{self.tgt_lang}"] = src.sha256, tgt.sha256
        return dict(sorted(digests.items()))
