"""The run directory: everything a training run leaves behind, written by rank 0 only.

    runs/<name>/
      config.yaml          the resolved config (after overrides)
      vocab/               the TextPipeline: vocabularies, SentencePiece model, settings
      metrics.jsonl        one JSON object per log line and per epoch
      train.log            every line rank 0 printed, each with its time; a resumed run appends to it
      charts/              loss, learning rate and BLEU curves (.html with inlined JavaScript, .png)
      tensorboard/         the same figures as TensorBoard event files (train.tensorboard=true)
      epoch_NN.safetensors model weights after epoch NN (for averaging), with epoch_NN.json beside it
      best.safetensors     the weights that scored best on validation, with best.json (config, vocabulary)
      last.pt              everything needed to resume (optimizer, scheduler, data position, RNG)
      avg.safetensors      the average of the last train.average_last epochs' weights (when set), with avg.json

    The model files (.safetensors + .json) are harness/checkpointing.py's; a run begun by an older
    version may hold its weights as best.pt, avg.pt and epoch_NN.pt instead.
      .lock                held (flock) by the live training writing here; removed when it ends
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows has no flock: there a second training on a live run's folder goes undetected
    fcntl = None  # type: ignore[assignment]

from ..config import MODEL_EXTENSIONS, Config, apply_dict, config_to_dict, config_yaml
from ..runtime.errors import ConfigError, RunDirError
from ..runtime.files import atomic_write, run_dir_error, writing
from .checkpointing import load_checkpoint, weights_pair

# What a run writes before its first checkpoint: a folder holding only these may start again.
STARTED_FILES = {"config.yaml", "vocab", "metrics.jsonl", "train.log", "charts", "tensorboard"}

# The file a live training holds an OS lock on; it is not part of the run (a killed run may leave it, unlocked).
LOCK_FILE = ".lock"

# flock errors meaning "this filesystem cannot lock", not "another process holds it": go on without a lock.
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

_HELD_LOCKS: set[int] = set()  # descriptors of the run-directory locks this process holds


def _close_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): drop its copies of the lock descriptors.

    A flock lives while any descriptor of its open file is open, so a worker that outlived a killed
    trainer for a moment would keep the folder locked; closing the copy (never unlocking) leaves the
    lock to the parent alone.
    """
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


# Data settings that say where files are or how they are read, not what the model learns from.
NOT_SETTINGS = {"data": {"root", "cache_dir", "num_workers"}}


def check_same_settings(saved: dict[str, Any], cfg: Config, path: Path) -> None:
    """A run can only be continued with the model and data settings that wrote its last.pt.

    Where the data lives (`data.root`, `data.cache_dir`) and how many workers read it may change.
    """
    # older names read as the current ones, keys an older run did not have at their defaults
    now, saved = config_to_dict(cfg), config_to_dict(apply_dict(Config(), saved, source="the saved config"))
    for model in (now["model"], saved["model"]):  # a rate left at null is model.dropout: the same model
        for rate in ("attention_dropout", "activation_dropout"):
            model[rate] = model["dropout"] if model.get(rate) is None else model[rate]
    for section in ("model", *MODEL_EXTENSIONS, "data"):  # what shapes the model and its data
        skip = NOT_SETTINGS.get(section, set())
        old = {k: v for k, v in saved.get(section, {}).items() if k not in skip}
        new = {k: v for k, v in now[section].items() if k not in skip}
        if old != new:
            diffs = [k for k in new if old.get(k) != new[k]] or sorted(set(old) - set(new))
            raise ConfigError(f"cannot resume {path}: its {section} settings differ ({', '.join(diffs)}); "
                              "resume with the same config, replace the run with train.overwrite=true, "
                              "or choose another train.out_dir")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a metrics.jsonl, oldest first; blank lines and a half-written last line are skipped.

    Training may be appending to the file while it is read (a chart drawn mid-run), and a run killed
    mid-write leaves a torn last line that a resumed run drops. A missing file raises FileNotFoundError.
    """
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def retarget(state: dict[str, Any], records: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """`state` with the first epoch (and its train_seconds) whose val BLEU reached a new train.target_bleu.

    A resumed run may set another target: the epoch that reached the old one says nothing about it.
    """
    hits = [r for r in records if r.get("kind") == "epoch" and r.get("bleu") is not None
            and r.get("epoch", 0) <= state.get("epoch", 0) and target and r["bleu"] >= target]
    first = min(hits, key=lambda r: r["epoch"], default=None)
    return {**state, "target_epoch": first["epoch"] if first else None,
            "target_seconds": first.get("train_seconds") if first else None,
            "target_flops": first.get("train_flops") if first else None}


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (not one removed, and perhaps made anew, since it was opened)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


class RunDir:
    """Paths and writers of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None  # the open .lock while this object holds the folder
        self._made_folder = False  # `lock` created the folder: `unlock` removes it again when it stays empty

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def train_log(self) -> Path:
        """What the terminal showed, time-stamped (harness/distributed.py writes it)."""
        return self.path / "train.log"

    @property
    def vocab(self) -> Path:
        return self.path / "vocab"

    @property
    def charts(self) -> Path:
        return self.path / "charts"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    @property
    def best(self) -> Path:
        return self.path / "best.safetensors"

    @property
    def avg(self) -> Path:
        return self.path / "avg.safetensors"

    @property
    def lock_file(self) -> Path:
        """The file whose OS lock says a live training uses this folder (`lock`)."""
        return self.path / LOCK_FILE

    def epoch(self, epoch: int) -> Path:
        """The weights saved after `epoch` (1-based)."""
        return self.path / f"epoch_{epoch:02d}.safetensors"

    def epoch_files(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every epoch's weights, oldest first (by number: epoch_100 comes after epoch_99): its
        epoch_NN.safetensors, or the epoch_NN.pt of an older version."""
        found: dict[int, Path] = {}
        for path in sorted(self.path.glob("epoch_*.pt")) + sorted(self.path.glob("epoch_*.safetensors")):
            number = path.stem.removeprefix("epoch_")
            if number.isdigit():
                found[int(number)] = path  # the model file wins over a .pt of the same epoch
        return sorted(found.items())

    def prune_epochs(self, keep_after: int) -> None:
        """Delete the weight files of epochs up to `keep_after` (train.keep_last_epochs)."""
        for epoch, path in self.epoch_files():
            if epoch <= keep_after:
                for old in (*weights_pair(path.with_suffix("")), path.with_suffix(".pt")):
                    old.unlink(missing_ok=True)

    def entries(self) -> set[str]:
        """Names in the folder that belong to a run (all but .lock); empty when there is no folder."""
        return {p.name for p in self.path.iterdir()} - {LOCK_FILE} if self.path.is_dir() else set()

    def has_run(self) -> bool:
        """True when the folder holds a previous run's files."""
        return bool(self.entries())

    def lock(self) -> None:
        """Hold the folder for this process until `unlock`; a RunDirError line when a live training holds it.

        An OS lock (flock) on .lock, open for the run's lifetime: the kernel drops it when the process
        ends, however it ends (SIGKILL included), so a killed run never leaves a stale lock. The pid and
        host written inside only tell the user who holds it. Without fcntl (Windows) nothing is locked.
        """
        if fcntl is None or self._lock_fd is not None:
            return
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(self._not_a_folder())
        for _ in range(10):  # a run ending meanwhile removes .lock (or its empty folder): take the new one
            fd = self._open_lock_file()
            if fd is None:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 512, 0)
                os.close(fd)
                if exc.errno in _NO_LOCKING:  # e.g. a network filesystem without locks: run unguarded
                    return
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RunDirError(self._in_use(holder)) from None
                raise run_dir_error(exc, self.lock_file, "lock") from None
            if _same_file(fd, self.lock_file):
                self._hold(fd)
                return
            os.close(fd)  # its holder removed this file as it ended; a new .lock may be there
        raise RunDirError(f"cannot lock {self.lock_file}: it keeps disappearing; is another program removing "
                          f"{self.path}? Choose another train.out_dir")

    def unlock(self) -> None:
        """Release the folder taken by `lock`: .lock is removed (and the folder, if `lock` made it and it is empty)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        _HELD_LOCKS.discard(fd)
        try:  # removed while still locked: a process that opened this file meanwhile sees it gone and retries
            self.lock_file.unlink(missing_ok=True)
            if self._made_folder:
                self.path.rmdir()  # only when empty: a run that wrote nothing leaves nothing
        except OSError:
            pass  # a leftover .lock (or folder) is harmless: nothing holds it
        finally:
            self._made_folder = False
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _open_lock_file(self) -> int | None:
        """A read-write descriptor of .lock, made (with the folder) when missing; None when the folder vanished."""
        with writing(self.path, "create the run directory", run=self.path):
            if not self.path.is_dir():
                self.path.mkdir(parents=True, exist_ok=True)
                self._made_folder = True
        try:
            return os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the folder was removed between the two steps
            return None
        except OSError as exc:
            raise run_dir_error(exc, self.lock_file, "create", self.path) from None

    def _hold(self, fd: int) -> None:
        """Keep the locked descriptor and write who holds it (informative: the lock is the flock itself)."""
        self._lock_fd = fd
        _HELD_LOCKS.add(fd)
        holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder + b"\n", 0)
        except OSError:
            pass  # a full disk here still leaves the lock held; the first real write reports it

    def _in_use(self, holder: bytes) -> str:
        """The refusal for a folder whose lock another process holds, naming that process when .lock says."""
        try:
            info = json.loads(holder)
            pid, host = int(info["pid"]), str(info["host"])
        except (ValueError, TypeError, KeyError):
            who, stop = "its process id is unknown", "stop it"
        else:
            here = host == socket.gethostname()
            who = f"pid {pid} on {'this host' if here else 'host ' + host}"
            stop = f"stop it (kill {pid})" if here else f"stop it on {host}"
        return (f"run directory {self.path} is in use by another training ({who}); wait for it to end or {stop}, "
                "or choose another train.out_dir")

    def _not_a_folder(self) -> str:
        return f"train.out_dir {self.path} is a file, not a folder; choose another train.out_dir"

    def start_mode(self, cfg: Config) -> tuple[str, dict[str, Any] | None]:
        """How a training begins in this folder: ('start', None), ('resume', last.pt) or ('finished', last.pt).

        `train.resume=auto` continues a run whose last.pt has the same model and data settings and
        leaves a finished one as it is; `true` insists on last.pt; `false` refuses any earlier run;
        `train.overwrite=true` replaces it. A folder that holds only what a run writes before its
        first checkpoint (it died in its first epoch) starts again. Anything else raises one line.
        """
        t = cfg.train
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(self._not_a_folder())
        if t.resume is True and not self.last.is_file():
            raise ConfigError(f"train.resume=true but {self.last} does not exist; start a new run without "
                              "train.resume")
        if t.overwrite or not self.has_run():
            return "start", None
        if t.resume is False:
            raise ConfigError(f"run directory {self.path} already holds a run; continue it with train.resume=auto, "
                              "replace it with train.overwrite=true, or choose another train.out_dir")
        if not self.last.is_file():
            if self.entries() <= STARTED_FILES:
                return "start", None
            raise ConfigError(f"run directory {self.path} holds files but no last.pt, so it cannot be continued; "
                              "replace it with train.overwrite=true or choose another train.out_dir")
        last = load_checkpoint(self.last)
        check_same_settings(last.get("config", {}), cfg, self.last)
        if last.get("config", {}).get("train", {}).get("target_bleu", 0.0) != t.target_bleu:
            last["train_state"] = retarget(last.get("train_state", {}), self.records(), t.target_bleu)
        state = last.get("train_state", {})
        done = t.finished(state.get("epoch", 0), state.get("step", 0), state.get("target_epoch") is not None)
        return ("finished" if done and t.resume == "auto" else "resume"), last

    def prepare(self, cfg: Config, start_mode: str) -> None:
        """Create the folder (emptied for a fresh start) and write the resolved config."""
        with writing(self.path, "create the run directory", run=self.path):
            # train.overwrite, or a run that died before its first checkpoint
            if start_mode == "start" and self.has_run():
                self._clear()
            self.path.mkdir(parents=True, exist_ok=True)
        with writing(self.config, run=self.path):
            atomic_write(self.config, lambda f: f.write(config_yaml(cfg).encode("utf-8")))

    def _clear(self) -> None:
        """Delete the folder's contents but .lock: removing a held lock file would let another run lock a new one."""
        for child in self.path.iterdir():
            if child.name == LOCK_FILE:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def save_text(self, text: Any) -> None:
        """The run's TextPipeline (vocabularies, SentencePiece model) in vocab/, what translating reads."""
        with writing(self.vocab, run=self.path):
            text.save(self.vocab)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line (with a wall-clock time stamp) to metrics.jsonl."""
        record = {**record, "time": round(time.time(), 3)}
        with writing(self.metrics, run=self.path), self.metrics.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl (empty when missing), as `read_metrics` reads them."""
        return read_metrics(self.metrics) if self.metrics.is_file() else []

    def truncate_metrics(self, step: int) -> None:
        """Drop records logged after optimizer step `step` (a resumed run logs them again)."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        with writing(self.metrics, run=self.path):
            atomic_write(self.metrics, lambda f: f.write(text.encode("utf-8")))
