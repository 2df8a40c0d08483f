"""Your own parallel text: each split is two files, PREFIX.SRC_LANG and PREFIX.TGT_LANG, one sentence a line.

    data:
      dataset: files
      train: corpus/train      # corpus/train.fr and corpus/train.en (or .fr.gz / .en.gz)
      val: corpus/val
      test: corpus/test        # optional
      src_lang: fr
      tgt_lang: en

The naming is fairseq's and JoeyNMT's (and Multi30k's own: train.de.gz, train.en.gz). Every file is
read whole, as UTF-8, plain or gzip-compressed, and checked before anything is tokenised or cached:
a missing, empty or non-UTF-8 file, or two files of a split whose line counts differ, is one
DataError line that names the file. The sha256 of every file's bytes keys the data cache, so
different files never share a cache entry, and the same files moved elsewhere still find theirs.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime.errors import DataError

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
    if plain.is_file() and packed.is_file():
        raise DataError(f"{key}={prefix} names both {plain} and {packed}; remove one of them")
    for path in (plain, packed):
        if path.is_file():
            return path
    raise DataError(f"{key}={prefix} needs the file {plain} (or {packed.name}), which does not exist; "
                    f"check the path (relative paths start from {Path.cwd()})")


def read_file(path: Path) -> tuple[list[str], str]:
    """(lines, sha256 of the file's bytes) of one plain or gzip-compressed UTF-8 file; DataError when unusable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{path} is not a complete gzip file ({exc}); compress it again, or give it "
                            "uncompressed without the .gz") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path} is not UTF-8 text: line {line} has the byte 0x{raw[exc.start]:02x}; convert the "
                        f"file, e.g. iconv -f LATIN1 -t UTF-8 (with its real encoding)") from None
    lines = split_lines(text.removeprefix("\ufeff"))  # a byte-order mark is not part of the first sentence
    if not any(lines):
        raise DataError(f"{path} is empty: every split needs sentences, one a line")
    return lines, digest


@dataclass(eq=False)
class OwnFiles:
    """Your parallel corpus: each split's (source, target) files, read and checked on first use."""

    files: dict[str, tuple[Path, Path]]  # split -> (source file, target file)
    src_lang: str
    tgt_lang: str
    name: str = "your files"  # how the log names the corpus
    _lines: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict, repr=False)
    _sha256: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, d: Any) -> OwnFiles:
        """The files data.train / data.val / data.test name; every one must exist (they are read later)."""
        files = {}
        for split in SPLIT_KEYS:
            prefix = getattr(d, split)
            if prefix:
                files[split] = (find_file(prefix, d.src_lang, f"data.{split}"),
                                find_file(prefix, d.tgt_lang, f"data.{split}"))
        if "train" not in files or "val" not in files:  # validate() says this first; here for a Config built by hand
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

    def read(self, split: str) -> tuple[list[str], list[str]]:
        """The aligned source and target lines of `split`, checked (read once, then kept)."""
        if split not in self._lines:
            if split not in self.files:
                raise DataError(f"there is no {split} split: set data.{split} to the prefix of its files")
            src_path, tgt_path = self.files[split]
            src, self._sha256[f"{split}.{self.src_lang}"] = read_file(src_path)
            tgt, self._sha256[f"{split}.{self.tgt_lang}"] = read_file(tgt_path)
            if len(src) != len(tgt):
                raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: line i of one must "
                                "be the translation of line i of the other; fix the files so they pair up")
            self._lines[split] = (src, tgt)
        return self._lines[split]

    def fingerprint(self) -> dict[str, str]:
        """The sha256 of every file by split and language (every file is read and checked first)."""
        for split in self.splits:
            self.read(split)
        return dict(sorted(self._sha256.items()))
