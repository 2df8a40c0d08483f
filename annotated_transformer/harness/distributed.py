"""Distributed setup for torchrun (one process = one rank), and rank-0 helpers.

The same code path serves one CPU process, one GPU, and `torchrun --nproc_per_node=N`:
torchrun sets RANK / LOCAL_RANK / WORLD_SIZE (and the rendezvous address), a plain
`python` run has none of them and is rank 0 of 1. Which device a rank uses, and at what
precision, is decided in runtime/device.py.

Rank 0's lines (`print0`) go through one logger, "annotated_transformer": to the terminal as they are and,
while a run's log is open (the Trainer opens it once the run directory is ready, `train_worker` closes it),
to its train.log with a time stamp in front of every line.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..runtime import device as devices
from ..runtime.errors import ConfigError, DistributedError, Terminated, UserError, excerpt
from ..runtime.files import writing


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that logs, writes charts and saves checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one process."""
        return self.world_size > 1


def dist_info_from_env() -> DistInfo:
    """Read torchrun's environment variables (rank 0 of 1 when absent)."""
    try:
        return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                        int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError as exc:
        raise ConfigError(f"bad torchrun environment (RANK/LOCAL_RANK/WORLD_SIZE): {exc}") from None


def init_distributed(device_spec: str = "auto") -> tuple[DistInfo, torch.device]:
    """Pick this rank's device and, under torchrun, join the process group (NCCL on CUDA, gloo otherwise).

    A rank that cannot join raises a one-line `DistributedError` (backend, address, rank, cause, hint).
    """
    info = dist_info_from_env()
    device = devices.select_device(device_spec, info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if info.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        timeout = timedelta(minutes=30)
        try:
            store = _restart_scoped_store(info, timeout)
            if store is not None:
                kwargs.update(store=store, rank=info.rank, world_size=info.world_size)
            dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
        except Exception as exc:
            lines = str(exc).strip().splitlines()
            cause = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
            where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            raise DistributedError(
                f"rank {info.rank} of {info.world_size} could not join the {backend} process group at {where} "
                f"({cause}); check that every rank runs the same torchrun command and can reach that address; "
                "if this follows a torchrun restart across several nodes, run torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1") from exc
    return info, device


@contextmanager
def ranks_agree(info: DistInfo, what: str) -> Iterator[None]:
    """A one-line failure (UserError) inside the block, on any rank, stops every rank: under torchrun the ranks
    compare after the block, so none goes on to a collective that a failed rank never reaches (a hang until the
    timeout). `what` names the step in the line the other ranks give."""
    failure: UserError | None = None
    try:
        yield
    except UserError as exc:
        if not info.distributed:
            raise
        failure = exc
    if not info.distributed:
        return
    seen: list[object] = [None] * info.world_size
    dist.all_gather_object(seen, (failure is not None, str(failure or "")))
    if failure is not None:
        raise failure
    failed = next(((rank, line) for rank, (fails, line) in enumerate(seen) if fails), None)  # type: ignore[misc]
    if failed is not None:
        raise DistributedError(f"rank {failed[0]} could not {what}: {failed[1] or 'an error without a message'}")


def _restart_scoped_store(info: DistInfo, timeout: timedelta) -> dist.Store | None:
    """torchrun's shared store with this restart's own key prefix, on one node; None elsewhere (torch's default).

    Under torchrun's c10d and static rendezvous (--standalone included) every rank is a client of one
    TCPStore that the elastic agent hosts at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True),
    and the agent (torch 2.15 checked) keeps that store, on the same port, across --max-restarts
    restarts. Each rank's gloo address (or NCCL id) goes under the same keys in every attempt, so a
    restarted rank can read the killed worker's address and fail in connectFullMesh with "Connection
    refused", or hang (as in pytorch/pytorch#135712), as most restarts on 2 CPU ranks did. All the workers of one
    node share one TORCHELASTIC_RESTART_COUNT, so there the keys
    go under a per-restart prefix (8 of 8 restarts joined). Across nodes each agent counts its own
    restarts and the counts can differ, so torch's default is kept; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    on torchrun's command line gives every restart a fresh store there.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), info.world_size, is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"annotated_transformer/restart_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


_HOST_GROUP: list[dist.ProcessGroup | None] = []  # made once per process group, on first use


def host_group() -> dist.ProcessGroup | None:
    """A gloo group for small host-side flags: the job's default group when it is gloo, else one made once.

    Every rank must call this at the same point the first time (new_group is a collective).
    """
    if not _HOST_GROUP:
        _HOST_GROUP.append(None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


def cleanup() -> None:
    """Leave the process group, if any."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _HOST_GROUP.clear()


def is_main_process() -> bool:
    """Rank 0, or not distributed at all."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


LOGGER_NAME = "annotated_transformer"
RESULT = logging.INFO + 5  # a run's outcome (its final scores, where it stopped): what --quiet still shows
logging.addLevelName(RESULT, "RESULT")
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # train.log's time stamps: 2026-11-27 19:58:03

logger = logging.getLogger(LOGGER_NAME)
logger.setLevel(logging.INFO)
logger.propagate = False  # an application's own root handlers would print every line twice


class _Terminal(logging.Handler):
    """The terminal: each message as it is, on the sys.stdout of the moment (a test may have swapped it), written
    above tqdm's progress bar while one shows."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "file_only", False):
            return
        try:
            message = self.format(record)
            if getattr(tqdm, "_instances", None):
                tqdm.write(message, file=sys.stdout)
            else:
                sys.stdout.write(message + "\n")
            sys.stdout.flush()
        except Exception:
            self.handleError(record)


class _Stamped(logging.Formatter):
    """train.log's form: the time stamp before every line of a message (a block of examples too)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, TIME_FORMAT)
        return "\n".join(f"{stamp} {line}" for line in record.getMessage().split("\n"))


class _RunLog(logging.FileHandler):
    """train.log, which a full disk or a lost mount must not turn into a traceback at every line: the first write
    that fails is told once, in one line on stderr, and the file gets nothing more (the terminal still does)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", encoding="utf-8")
        self.shown = path  # as the user gave it (runs/x/train.log), not made absolute
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def flush(self) -> None:
        if self.failed:
            return
        try:
            super().flush()
        except OSError:  # on close: what is still buffered cannot be written either
            self.handleError(None)

    def handleError(self, record: logging.LogRecord | None) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)  # a bug (a message that does not format): logging's own report
            return
        self.failed = True
        stream, self.stream = self.stream, None
        try:
            stream.close()
        except (OSError, AttributeError):
            pass  # its buffer cannot be written either; the file keeps what reached it
        print(f"warning: cannot write {self.shown}: {error.strerror or error}; the log goes on in the terminal only",
              file=sys.stderr, flush=True)


_TERMINAL = _Terminal()
logger.addHandler(_TERMINAL)
_RUN_LOG: list[_RunLog] = []  # the open train.log, if any
_DEFAULT_LEVEL = [logging.INFO]  # RESULT inside `result_lines`


def print0(*args: object, level: int | None = None) -> None:
    """One line (or block) from rank 0 only, through the logger: the terminal, and train.log while it is open.

    Its level: `level` when given, WARNING for a line that starts with 'warning:', else INFO (RESULT inside
    `result_lines`); --quiet shows RESULT and above.
    """
    if not is_main_process():
        return
    text = " ".join(map(str, args))
    if level is None:
        level = logging.WARNING if text.startswith("warning:") else _DEFAULT_LEVEL[-1]
    logger.log(level, text)


@contextmanager
def result_lines() -> Iterator[None]:
    """Inside this block print0's lines are the run's result (level RESULT): --quiet shows them."""
    _DEFAULT_LEVEL.append(RESULT)
    try:
        yield
    finally:
        _DEFAULT_LEVEL.pop()


@contextmanager
def quiet_terminal(quiet: bool = True) -> Iterator[None]:
    """With `quiet`, the terminal shows only warnings, errors and results (train.log still gets every line)."""
    before = _TERMINAL.level
    _TERMINAL.setLevel(RESULT if quiet else logging.NOTSET)
    try:
        yield
    finally:
        _TERMINAL.setLevel(before)


class _Early(logging.Handler):
    """The lines a run logs before its train.log is open (its data line, what train.overwrite deleted), kept for it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_EARLY: list[_Early] = []  # while a run starts: its lines so far


@contextmanager
def early_lines_kept() -> Iterator[None]:
    """Inside the block, print0's lines before `open_run_log` go into train.log too, when it opens, with the times
    they were logged; dropped when no run log opens (a run that could not start)."""
    early = _Early()
    logger.addHandler(early)
    _EARLY.append(early)
    try:
        yield
    finally:
        _drop_early(early)


def _drop_early(early: _Early) -> None:
    if early in _EARLY:
        _EARLY.remove(early)
    logger.removeHandler(early)


def open_run_log(path: Path) -> None:
    """Append every line print0 logs from now on to `path`, time-stamped, after those kept since the run began
    (`early_lines_kept`); replaces any run log still open."""
    close_run_log()
    with writing(path, "open", run=path.parent):
        handler = _RunLog(path)
    handler.setFormatter(_Stamped())
    for early in list(_EARLY):
        for record in early.records:
            handler.handle(record)
        _drop_early(early)
    logger.addHandler(handler)
    _RUN_LOG.append(handler)


def close_run_log(error: BaseException | None = None) -> None:
    """Close the open train.log, if any; `error`, the exception that ends the run, is written to it first."""
    if not _RUN_LOG:
        return
    handler = _RUN_LOG.pop()
    if isinstance(error, (Exception, KeyboardInterrupt, Terminated)):  # not SystemExit: its message was printed
        logger.error(f"error: {describe_error(error)}", extra={"file_only": True})  # the terminal gets it on stderr
    logger.removeHandler(handler)
    handler.close()


def describe_error(error: BaseException) -> str:
    """The one line an error that ends a run is told in: a UserError's message, Ctrl-C, or the type and its first
    line (whose traceback the terminal shows)."""
    if isinstance(error, UserError):
        return " ".join(str(error).split())
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, Terminated):
        return "terminated (SIGTERM)"
    return f"{type(error).__name__}: {excerpt(error, 300)}"


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


