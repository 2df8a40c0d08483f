"""Small file-system helpers shared by checkpoints, downloads, the data cache and the run directory."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import DataError, RunDirError, UserError, terminate_raises

# Where the project keeps what it can make again: the default data.cache_dir, and the chart script's copy.
USER_CACHE = "~/.cache/annotated_transformer"


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def give_default_permissions(path: str | Path) -> None:
    """Give a file or folder tree made by mkstemp/mkdtemp (owner-only) what a plain open()/mkdir() would.

    Without this a shared cache or run directory written by one user stays unreadable to others.
    """
    path = Path(path)
    umask = current_umask()
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Any], object], follow_link: bool = False) -> None:
    """Call `write(file_object)` on a temporary file beside `path`, fsync it, then rename it into place.

    A crash at any moment leaves either the old file or the new one, never half a file, and a SIGTERM meanwhile
    (`kill`, `timeout`) ends the process as an exception (`Terminated`) that removes the temporary first. A
    symbolic link at `path` is replaced by the file, unless `follow_link` (a command's --out, which the user named):
    then the file it names gets the new content and the link stays.
    """
    path = Path(path)
    if follow_link and path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with terminate_raises():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            _permissions_of(path, tmp)  # mkstemp creates owner-only files
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    _fsync_dir(path.parent)


def _permissions_of(path: Path, tmp: str) -> None:
    """Give `tmp` the permissions of the file `path` it replaces (a file you made read-only stays so), or, where there
    is none, those a plain open() would."""
    try:
        st = os.lstat(path)  # a symbolic link replaced is not its file: the defaults
        mode = st.st_mode & 0o777 if stat.S_ISREG(st.st_mode) else None  # never a set-id or sticky bit
    except OSError:
        mode = None
    if mode is None:
        give_default_permissions(tmp)
    else:
        os.chmod(tmp, mode)


def write_json(path: str | Path, value: Any) -> None:
    """`value` as indented JSON at `path`, atomically (a process killed while writing leaves the earlier file whole)."""
    data = (json.dumps(value, indent=1) + "\n").encode("utf-8")
    with writing(path):  # a full disk after minutes of measuring: one line, not a traceback
        atomic_write(path, lambda f: f.write(data))


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (a link or another spelling of the path included)."""
    try:
        return Path(a).exists() and Path(b).exists() and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_to_replace(path: str | Path, overwrite: bool, what: str = "--out") -> None:
    """The one rule of every command that writes a file: an existing output is replaced only when asked.

    Raises a one-line UserError naming `path` and the two ways on (another `what`, or --overwrite).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        kind = "folder" if path.is_dir() else "file"
        raise UserError(f"{path} already exists (a {kind}); choose another {what}, or pass --overwrite to replace it")


_HINTS = {  # {other}: the run's train.out_dir, or for any other file "place to write"
    errno.ENOSPC: "free some disk space or choose another {other}",
    errno.EDQUOT: "free some quota or choose another {other}",
    errno.EACCES: "check its permissions or choose another {other}",
    errno.EPERM: "check its permissions or choose another {other}",
    errno.EROFS: "the filesystem is read-only; choose another {other}",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another {other}",
    errno.EEXIST: "a file is in the way; remove it or choose another {other}",
}


# A full disk or quota: the run's files so far are intact (atomic writes), so freeing space and rerunning continues.
_FULL = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some quota"}


@contextmanager
def writing(path: str | Path, what: str = "write", run: str | Path | None = None) -> Iterator[None]:
    """Turn an OSError raised inside the block into one RunDirError line: the path, the cause, a fix."""
    try:
        yield
    except OSError as exc:
        raise run_dir_error(exc, path, what, run) from None


def run_dir_error(exc: OSError, path: str | Path, what: str = "write", run: str | Path | None = None) -> RunDirError:
    """The one-line RunDirError for an OSError met while writing `path` (a file of the training run in `run`)."""
    where = exc.filename or path
    if str(where).endswith(".tmp"):  # atomic_write's temporary file: name the file the user knows
        where = path
    if run is not None and exc.errno in _FULL:
        last = Path(run) / "last.pt"
        again = f"resume from {last}, which is intact" if last.is_file() else "start the run again"
        error = RunDirError(f"cannot {what} {where}: {exc.strerror or exc}; {_FULL[exc.errno]} on the disk holding "
                            f"{run}, then run the same command again to {again}")
        error.resumes_from = last if last.is_file() else None  # the line names it: a caller need not again
        return error
    hint = _HINTS.get(exc.errno or 0, "check the path or choose another {other}")
    hint = hint.format(other="train.out_dir" if run is not None else "place to write")
    return RunDirError(f"cannot {what} {where}: {exc.strerror or exc}; {hint}")


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
        raise DataError(not_utf8("standard input" if source == "-" else source, line, raw[exc.start])) from None
    return text.splitlines()


def not_gzip(name: str | Path, problem: BaseException) -> str:
    """The one line for a .gz file whose stream is damaged or cut, alike for every file a command reads."""
    return f"{name} is not a complete gzip file ({problem}); compress it again, or give it uncompressed without the .gz"


def not_utf8(name: str | Path, line: int, byte: int) -> str:
    """The one line for text that is not UTF-8, alike for every file a command reads."""
    return (f"{name} is not UTF-8 text: line {line} has the byte 0x{byte:02x}; convert the file, e.g. "
            "iconv -f LATIN1 -t UTF-8 (with its real encoding)")
