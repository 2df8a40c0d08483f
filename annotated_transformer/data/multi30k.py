"""Multi30k task 1 (de<->en Flickr30k captions): find, download, verify and read the six raw files.

Where the files come from, in order:

1. `data.root` in the config, else
2. the `MULTI30K_DIR` environment variable: a folder holding the six files (offline machines), else
3. a download from the canonical `multi30k/dataset` GitHub repository (base URL overridable with
   `MULTI30K_URL`) into `<data.cache_dir>/multi30k/`.

Every file is checked against its sha256 before use, wherever it came from; a bad file is never
read. Downloads go to a temporary file that is renamed into place only once verified, so an
interrupted download never leaves a file that looks complete.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.errors import DataError
from ..runtime.files import give_default_permissions
from .own_files import CHUNK_BYTES, file_chunks, split_lines

MULTI30K_FILES: dict[str, str] = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
SPLIT_FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}
SPLIT_PAIRS = {"train": 29000, "val": 1014, "test": 1000}  # the lines of the files MULTI30K_FILES' checksums verify
DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
URL_ENV = "MULTI30K_URL"
DIR_ENV = "MULTI30K_DIR"

_FIX = f"put the six Multi30k .gz files in a folder and set {DIR_ENV} (or data.root) to it"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _gzip_problem(path: Path) -> str | None:
    """Why `path` is not a complete gzip stream, or None when it decompresses to the end."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except EOFError:
        return "truncated (the gzip stream ends early)"
    except (OSError, zlib.error) as exc:
        return f"not a valid gzip file ({exc})"
    return None


def verification_problem(path: Path) -> str | None:
    """Why the Multi30k file at `path` must not be used, or None when it is the canonical file."""
    expected = MULTI30K_FILES[path.name]
    if not path.is_file():
        return "missing"
    actual = sha256_file(path)
    if actual == expected:
        return None
    # A checksum says only "different"; say *how* when we can, since a cut-off copy is the usual cause.
    return _gzip_problem(path) or (f"corrupted or a different version (sha256 {actual[:12]}..., "
                                   f"expected {expected[:12]}...)")


def split_files(split: str) -> tuple[str, ...]:
    """The two file names of one split (both languages): all that scoring that split reads."""
    return tuple(f"{SPLIT_FILES[split]}.{lang}.gz" for lang in ("de", "en"))


def verify_dir(folder: Path, source: str, names: Sequence[str] = tuple(MULTI30K_FILES)) -> Path:
    """Check that `folder` holds the canonical files `names` (all six unless told); one clear DataError otherwise."""
    if not folder.is_dir():
        raise DataError(f"{source} points at {folder}, which is not a folder; {_FIX}")
    for name in names:
        problem = verification_problem(folder / name)
        if problem == "missing":
            raise DataError(f"Multi30k file {folder / name} is missing ({source}); {_FIX}")
        if problem:
            raise DataError(f"Multi30k file {folder / name} is {problem} ({source}); replace it with the "
                            f"canonical file from {DEFAULT_URL}/{name}, or {_FIX}")
    return folder


class _BadDownload(Exception):
    """The server answered, but with the wrong bytes."""


def _download_once(url: str, dest: Path, expected: str, timeout: float) -> None:
    """Fetch `url` into a temporary file beside `dest`; rename it into place only if its sha256 matches."""
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            for block in iter(lambda: response.read(1 << 16), b""):
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != expected:
            problem = _gzip_problem(tmp) or f"corrupted (sha256 {h.hexdigest()[:12]}..., expected {expected[:12]}...)"
            raise _BadDownload(problem)
        give_default_permissions(tmp)  # mkstemp made it owner-only; a shared cache should stay readable
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download_file(name: str, dest_dir: Path, base_url: str, retries: int = 3, backoff_s: float = 1.0,
                  timeout: float = 60.0, log: Callable[[str], None] | None = None) -> Path:
    """Download one Multi30k file into `dest_dir`, verified, retrying with a growing pause; DataError on failure."""
    url = f"{base_url.rstrip('/')}/{name}"
    dest = dest_dir / name
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the download folder {dest_dir} ({exc.strerror or exc}); "
                        f"set data.cache_dir to a writable folder, or {_FIX}") from None
    last = ""
    for attempt in range(1, retries + 1):
        try:
            _download_once(url, dest, MULTI30K_FILES[name], timeout)
            return dest
        except _BadDownload as exc:
            last = f"the downloaded file is {exc}"
        except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: a malformed URL
            last = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
        if attempt < retries:
            if log:
                log(f"download of {url} failed ({last}); retrying ({attempt}/{retries - 1})")
            time.sleep(backoff_s * 2 ** (attempt - 1))
    raise DataError(f"cannot download Multi30k file {name} from {url} after {retries} tries ({last}); "
                    f"check the network, or {_FIX}")


def resolve_multi30k_dir(data_cfg: Any, base_url: str | None = None, retries: int = 3, backoff_s: float = 1.0,
                         log: Callable[[str], None] | None = None, names: Sequence[str] = tuple(MULTI30K_FILES)
                         ) -> Path:
    """The folder holding the verified files `names` (all six unless told: scoring one split needs its two):
    data.root, else $MULTI30K_DIR, else a download to the cache."""
    root = getattr(data_cfg, "root", None)
    if root:
        return verify_dir(Path(root).expanduser(), "data.root", names)
    env = os.environ.get(DIR_ENV)
    if env:
        return verify_dir(Path(env).expanduser(), DIR_ENV, names)
    folder = Path(data_cfg.cache_dir).expanduser() / "multi30k"
    base_url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
    for name in names:
        path = folder / name
        problem = verification_problem(path)
        if problem is None:
            continue
        if problem != "missing":
            # The cache holds a bad copy (a disk fault, an edit): a verified download replaces it, and only then
            # (offline, the copy stays, and this says so again next time).
            if log:
                log(f"cached {path} is {problem}; downloading it again")
        elif log:
            log(f"downloading {name} from {base_url}")
        download_file(name, folder, base_url, retries=retries, backoff_s=backoff_s, log=log)
    return folder


def _read_lines(path: Path) -> list[str]:
    try:
        with gzip.open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        raise DataError(f"Multi30k file {path} is missing; {_FIX}") from None
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"Multi30k file {path} is unreadable ({exc}); {_FIX}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"Multi30k file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); {_FIX}") from None
    return split_lines(text)


def read_split(root: Path, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """The aligned source and target lines of a split ('train', 'val' or 'test' = test_2016_flickr)."""
    if split not in SPLIT_FILES:
        raise ValueError(f"split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
    stem = SPLIT_FILES[split]
    src_path, tgt_path = Path(root) / f"{stem}.{src_lang}.gz", Path(root) / f"{stem}.{tgt_lang}.gz"
    src, tgt = _read_lines(src_path), _read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the two files do not "
                        f"belong together; replace them with the canonical files, or {_FIX}")
    return src, tgt


@dataclass(eq=False)
class Multi30k:
    """Multi30k's three splits in one direction (de->en or en->de), as a corpus: read when asked for."""

    root: Path  # the folder of the six verified files (resolve_multi30k_dir)
    src_lang: str
    tgt_lang: str
    name: str = "Multi30k"
    splits: tuple[str, ...] = tuple(SPLIT_FILES)

    @property
    def location(self) -> str:
        """The folder of the files (for the log and the statistics)."""
        return str(self.root)

    def paths(self, split: str) -> tuple[Path, Path]:
        """The source and target file of `split`."""
        stem = SPLIT_FILES[split]
        return self.root / f"{stem}.{self.src_lang}.gz", self.root / f"{stem}.{self.tgt_lang}.gz"

    def count(self, split: str) -> int:
        """The number of sentence pairs of `split` (known: the files were verified)."""
        return SPLIT_PAIRS[split]

    def read(self, split: str) -> tuple[list[str], list[str]]:
        """The aligned source and target lines of `split`, whole (not kept here)."""
        return read_split(self.root, split, self.src_lang, self.tgt_lang)

    def chunks(self, split: str, side: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[str]]:
        """The lines of one side ('src' or 'tgt') of `split`, a chunk at a time."""
        return file_chunks(self.paths(split)[("src", "tgt").index(side)], chunk_bytes)

    def fingerprint(self) -> dict[str, str]:
        """The six files' checksums: every file was verified against them (either direction reads all six)."""
        return dict(sorted(MULTI30K_FILES.items()))
