"""User-facing errors: one clear line, exit code 2, never a traceback.

Every mistake a user can make (a bad config key, a missing data file, a
corrupted checkpoint, an unreadable input) raises a subclass of `UserError`
whose message names the problem and the fix. The scripts wrap their `main` in
`run_cli`, which prints that one line on stderr and exits with the error's code:
2 for most, 3 for a diverged training run (`TrainingDiverged`). An error may carry
`details`: lines printed after that one line (a list to choose from, one item a line).
"""

from __future__ import annotations

import functools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn


SAME_SIGNAL_SECONDS = 1.0  # one keypress reaches `uv run` and python at most this far apart: signals closer are one


class UserError(Exception):
    """A problem the user can fix; its message is shown as-is, on one line, then any `details` lines."""

    exit_code = 2

    def __init__(self, message: str = "", details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


class ConfigError(UserError):
    """A config file, a dotted override or a combination of values is invalid."""


class DataError(UserError):
    """Data files are missing, corrupted or inconsistent."""


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable, unsafe or does not match."""


class ExportError(UserError):
    """A model cannot be exported to another engine, or an exported model folder is missing or damaged."""


class RunDirError(UserError):
    """The run directory (or a file in it) cannot be created or written: a path, permission or disk problem."""


class TrainingDiverged(UserError):
    """The loss (or gradient norm) stopped being finite; nothing was saved from the broken weights."""

    exit_code = 3


class Interrupted(KeyboardInterrupt):
    """Ctrl-C where it needs more than "interrupted": what it left and how to go on. A KeyboardInterrupt still (no
    `except Exception` swallows it); `run_cli` prints its line and exits 130, as for any Ctrl-C."""


class DistributedError(UserError):
    """A rank could not join the process group under torchrun: unreachable address, mismatched command, stale store."""


class Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`, a batch scheduler) as an exception, so that clean-ups run as for Ctrl-C."""

    def __init__(self, message: str = "terminated by SIGTERM while a file was written; the file is as it was") -> None:
        super().__init__(message)


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Inside the block SIGTERM raises `Terminated` in this process instead of killing it, so that clean-ups run
    (an atomic write removes its temporary file). Only around such writes: elsewhere a SIGTERM kills at once, even
    inside a long C call (a Python handler waits for its end). A forked child still dies at once, and a handler
    someone else installed is left alone (training's own, which saves and stops), as is any thread but the main."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    pid = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != pid:  # inherited by a fork: the default death
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def interrupt_after() -> Iterator[None]:
    """A Ctrl-C inside the block raises KeyboardInterrupt when the block ends, not inside it: around the import of a
    C extension, whose start-up turns an exception into another (pybind11's modules, ctranslate2, raise ImportError:
    "not installed") or swallows it. Python's own handler only (an ignored or another handler is left alone), in
    the main thread."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if caught:  # over an error the block raised too: the user's stop comes first
            raise KeyboardInterrupt


def listed(names: Sequence[str], shown: int = 3) -> str:
    """`names` for a message: the first `shown`, comma-separated, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def excerpt(text: object, limit: int = 160) -> str:
    """The first non-empty line of `text` (often an exception), at most `limit` characters, cut between words."""
    empty = type(text).__name__ if isinstance(text, BaseException) else ""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), empty)
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:(")
    return f"{cut} ..."


def fail(message: str, code: int = 2, details: Sequence[str] = ()) -> NoReturn:
    """Print `error: message` on one line of stderr (then any `details` lines) and exit with `code`."""
    one_line = " ".join(str(message).split())
    print(f"error: {one_line}", file=sys.stderr, flush=True)
    for line in details:
        print(line, file=sys.stderr, flush=True)
    raise SystemExit(code)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no file behind stdout
        return False


def run_cli(main: Callable[[], int | None], whole_process: bool = False) -> None:
    """Run a script's `main`, turning `UserError`, Ctrl-C and a SIGTERM met while a file is written
    (`terminate_raises`) into clean exits (130 and 143 for the two signals, as a shell reports them), and a closed
    output pipe (`| head`) into a quiet exit 141. `whole_process`: the process ends with the command, so once a
    Ctrl-C has ended it, that keypress's second copy is ignored while Python exits."""
    try:
        _run_main(main)
    except SystemExit as end:
        if whole_process and end.code == 130:
            # one Ctrl-C can arrive twice, a little apart (the terminal's copy and `uv run`'s): the second would raise
            # KeyboardInterrupt inside an exit hook (a traceback after the stop's clean line)
            ignore_same_keypress()
        raise


def ignore_same_keypress() -> None:
    """A SIGINT within SAME_SIGNAL_SECONDS from now is the same keypress's second copy, ignored; a later Ctrl-C
    interrupts again (and puts Python's handler back). In the main thread, over Python's own handler only."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, functools.partial(_late_interrupt, time.monotonic()))


def _late_interrupt(since: float, signum: int, frame: object) -> None:
    """SIGINT after a stop ended the command: the same keypress's copy is ignored, a later Ctrl-C interrupts (and
    Python's own handler is back)."""
    if time.monotonic() - since > SAME_SIGNAL_SECONDS:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt


def _run_main(main: Callable[[], int | None]) -> None:
    """`run_cli`'s work: `main`, with its errors and signals turned into one line and an exit code."""
    try:
        code = main()
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except BrokenPipeError:
        if not _stdout_closed():  # another pipe (a worker's, a child's): a fault to show, not a reader gone
            raise
        # The reader of our output went away (`... | head`): stop quietly, as a Unix tool killed by SIGPIPE does;
        # what is still buffered goes nowhere, so that the flush at exit raises nothing either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None
    except UserError as exc:
        # torchrun: every rank of a machine reads the same command line and config; its first rank says what is
        # wrong with them, once
        if isinstance(exc, ConfigError) and os.environ.get("LOCAL_RANK", "0") != "0":
            raise SystemExit(exc.exit_code) from None
        fail(str(exc), exc.exit_code, getattr(exc, "details", ()))
    except KeyboardInterrupt as exc:
        fail(str(exc) or "interrupted", 130)
    except Terminated:
        fail("terminated (SIGTERM)", 143)
    raise SystemExit(code or 0)
