"""The run directory: everything a training run leaves behind, written by rank 0 only.

    runs/<name>/
      config.yaml          the resolved config (after overrides)
      vocab/               the TextPipeline: vocabularies, SentencePiece model, settings
      metrics.jsonl        one JSON object per log line and per epoch
      train.log            every line rank 0 printed, each with its time; a resumed run appends to it
      charts/              loss, learning rate and BLEU curves (.html with inlined JavaScript, .png)
      tensorboard/         the same figures as TensorBoard event files (train.tensorboard=true)
      epoch_NN.safetensors model weights after epoch NN (for averaging), config and vocabulary inside
      step_NNNNNNN.safetensors  the same after optimizer step N (train.save_every_steps), zero-padded to sort
      best.safetensors     the weights that scored best on validation, config and vocabulary inside
      last.pt              everything needed to resume (optimizer, scheduler, data position, RNG)
      avg.safetensors      the average of the last train.average_last epoch (or step) files' weights, likewise

      .annotated-transformer-run   the marker: the project made this folder a run's (train.overwrite needs it)
      .lock                held (flock) by the live training writing here; removed when it ends

The model files (one .safetensors each) are checkpoints.py's; a run begun by an older version may hold its
weights as best.pt, avg.pt and epoch_NN.pt, or as pairs with a .json beside each, instead.

`RunDir` is the one owner of the folder: `open` takes the lock, decides start / resume / finished and makes the
folder the run's (the marker; a fresh start over an earlier run deletes only the names a run writes,
`OWN_NAMES`); it refuses a folder of someone else's files and removes the temporaries of killed writes. The run
writes config.yaml and vocab/ once it has begun (`save_settings`: after a resume's checks), and the rest to the
paths it names (`last`, `best`, `metrics`, ...).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist

try:
    import fcntl
except ImportError:  # Windows has no flock: there a second training on a live run's folder goes undetected
    fcntl = None  # type: ignore[assignment]

from ..data.text import TEXT_FILES
from ..config import MODEL_EXTENSIONS, Config, apply_dict, config_to_dict, config_yaml
from ..runtime.errors import CheckpointError, ConfigError, DistributedError, RunDirError, UserError, listed
from ..runtime.files import atomic_write, run_dir_error
from ..checkpoints import load_checkpoint, model_file_forms
from .distributed import ranks_agree

# What a run writes before its first checkpoint: a folder holding only these may start again.
STARTED_FILES = {"config.yaml", "vocab", "metrics.jsonl", "train.log", "charts", "tensorboard"}

# The file a live training holds an OS lock on; it is not part of the run (a killed run may leave it, unlocked).
LOCK_FILE = ".lock"

# Written when the project makes a folder a run's: train.overwrite clears only folders that carry it.
MARKER = ".annotated-transformer-run"
MARKER_FORMAT = "annotated-transformer/run/1"

# Every name the project writes in a run folder (training, evaluate's hypotheses, a sweep's scores): the only
# names train.overwrite deletes.
_EPOCH = r"epoch_(?:\d\d|[1-9]\d\d+)"  # as RunDir.epoch writes it: epoch_01, epoch_100 (epoch_1 is not ours)
_STEP = r"step_(?:\d{7}|[1-9]\d{7,})"  # as RunDir.step writes it: seven digits
OWN_NAMES = re.compile(rf"""(?x)^(?:
    config\.yaml | vocab | metrics\.jsonl | train\.log | charts | tensorboard | last\.pt | eval | test_scores\.json
  | (?:best|avg|{_EPOCH})\.(?:safetensors|json|pt) | {_STEP}\.safetensors
  | (?:(?:best|avg|last|{_EPOCH}|{_STEP})\.(?:val|test)(?:\.first\d+)?(?:\.(?:merge|prune)[\d.e+-]+)?
     (?:\.(?:int8|bf16))?(?:\.alpha[\d.e+-]+)? | test)
    \.beam\d+\.txt
  | \.annotated-transformer-run | \.lock
)$""")

# What training (and evaluate) writes inside the run's own folders: the only files deleted from them.
INSIDE = {
    "vocab": TEXT_FILES,
    "charts": re.compile(r"^training_curves\.(?:html|png)$"),
    "tensorboard": re.compile(r"^events\.out\.tfevents\..+$"),
    "eval": re.compile(r"^[^.].*\.beam\d+\.txt$"),
}

# atomic_write's temporary beside NAME (.NAME.RANDOM.tmp): a killed write leaves one behind.
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{6,}\.tmp$")

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
NOT_SETTINGS = {"data": {"root", "cache_dir", "num_workers"},
                "model": {"attention_kernel"}}  # a speed setting (fast/plan.py): the same weights, the same model


# Where your own files are: with the files' contents compared at a resume (`check_same_data`), they may move.
FILE_PREFIXES = {"train", "val", "test"}


def check_same_settings(saved: dict[str, Any], cfg: Config, path: Path, files_checked: bool = False) -> None:
    """A run can only be continued with the model and data settings that wrote its last.pt.

    Where the data lives (`data.root`, `data.cache_dir`) and how many workers read it may change; with
    `files_checked` (last.pt records its files' contents), so may the prefixes of your own files.
    """
    # older names read as the current ones, keys an older run did not have at their defaults
    now, saved = config_to_dict(cfg), config_to_dict(apply_dict(Config(), saved, source="the saved config"))
    for model in (now["model"], saved["model"]):  # a rate left at null is model.dropout: the same model
        for rate in ("attention_dropout", "activation_dropout"):
            model[rate] = model["dropout"] if model.get(rate) is None else model[rate]
    for section in ("model", *MODEL_EXTENSIONS, "data"):  # what shapes the model and its data
        skip = NOT_SETTINGS.get(section, set()) | (FILE_PREFIXES if section == "data" and files_checked else set())
        old = {k: v for k, v in saved.get(section, {}).items() if k not in skip}
        new = {k: v for k, v in now[section].items() if k not in skip}
        if old != new:
            diffs = [k for k in new if old.get(k) != new[k]] or sorted(set(old) - set(new))
            # what the run was trained with, as overrides: a config file may have changed since
            kept = " ".join(f"{section}.{k}={_spelt(old[k])}" for k in diffs if k in old)
            raise ConfigError(f"cannot resume {path}: its {section} settings differ ({', '.join(diffs)}); "
                              f"resume with the run's own ({kept}), replace the run with train.overwrite=true, "
                              "or choose another train.out_dir")


def _spelt(value: Any) -> str:
    """A setting's value as an override spells it on the command line (true, null, 0.1, [1, 2])."""
    return json.dumps(value) if isinstance(value, (bool, type(None), list, dict)) else str(value)


def check_resumable(last: dict[str, Any], path: Path) -> None:
    """One line for a last.pt whose parts are not what training writes (crafted, or damaged inside its pickle)."""
    wrong = None
    state = last.get("train_state")
    if not isinstance(last.get("config"), dict):
        wrong = "its config is not a mapping"
    elif not isinstance(state, dict):
        wrong = "its train_state is not a mapping" if "train_state" in last else "it has no train_state"
    elif not all(isinstance(state.get(k, 0), int) for k in ("epoch", "step")):
        wrong = "its epoch and step are not whole numbers"
    elif last.get("data") is not None and not _fingerprint_shape(last["data"]):
        wrong = "its data fingerprint is not one this project writes"
    if wrong:
        raise CheckpointError(f"{path} cannot be resumed: {wrong}; resume from a copy of the run's last.pt, or start a "
                              "new run with another train.out_dir")


def _fingerprint_shape(data: Any) -> bool:
    """Whether a recorded data fingerprint has the shape `data_fingerprint` gives (settings, files' sha256s)."""
    settings = data.get("settings") if isinstance(data, dict) else None
    files = settings.get("data") if isinstance(settings, dict) else None
    return isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())


def check_same_data(saved: dict[str, Any] | None, now: dict[str, Any], path: Path) -> None:
    """A run continues only on the data and tokenizer that wrote its last.pt (`data_fingerprint` of both).

    The test split is not compared: nothing of training reads it (the tokenizer learns from the training split,
    validation picks the weights), so a test set added or corrected meanwhile is scored at the run's end. A
    last.pt of an older version records no data: nothing to compare (its tokenizer is still compared, by
    `check_same_tokenizer`, after the data is loaded).
    """
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return
    old, new = saved["settings"], now["settings"]
    old_files, new_files = old.get("data") or {}, new.get("data") or {}
    changed = sorted(k for k in set(old_files) | set(new_files)
                     if old_files.get(k) != new_files.get(k) and not k.startswith("test."))
    ways = ("; resume with the same files again, replace the run with train.overwrite=true, or start a new run "
            "with another train.out_dir")
    if changed:
        what = ", ".join(_file_change(k, old_files, new_files) for k in changed)
        raise RunDirError(f"cannot resume {path}: its data files changed since it was written ({what} in "
                          f"{now.get('location')})" + ways)
    # The cache's format version changes how the ids are stored, never which ids: not a reason to refuse.
    settings = sorted(k for k in set(old) | set(new) if k not in ("data", "format") and old.get(k) != new.get(k))
    if settings:
        what = ", ".join(f"{k} {old.get(k)} -> {new.get(k)}" for k in settings)
        raise RunDirError(f"cannot resume {path}: the tokenizer's settings or version changed since it was written "
                          f"({what}), so the ids would mean other words; install the versions it was trained "
                          "with, replace the run with train.overwrite=true, or start a new run with another "
                          "train.out_dir")


def _file_change(key: str, old: dict[str, str], new: dict[str, str]) -> str:
    """How one data file (`split.lang`) differs: edited, added or gone."""
    if key not in old:
        return f"{key} is new"
    if key not in new:
        return f"{key} is gone"
    return (f"{key} has other contents (sha256 {old[key][:12]}... now {new[key][:12]}...; the file's bytes count, "
            "so the same text gzipped or unzipped differs too)")


def tokenizer_hash(text: dict[str, Any] | None) -> str | None:
    """A sha256 of a TextPipeline state_dict (vocabularies, SentencePiece model bytes, settings); None for none."""
    if text is None:
        return None
    digest = hashlib.sha256()

    def feed(obj: Any) -> None:
        if hasattr(obj, "numpy"):  # a tensor: the SentencePiece model's bytes
            digest.update(b"T" + obj.detach().cpu().numpy().tobytes())
        elif isinstance(obj, (bytes, bytearray)):
            digest.update(b"B" + bytes(obj))
        elif isinstance(obj, dict):
            for key in sorted(obj, key=str):
                digest.update(b"K" + str(key).encode())
                feed(obj[key])
        elif isinstance(obj, (list, tuple)):
            digest.update(b"L%d" % len(obj))
            for item in obj:
                feed(item)
        else:
            digest.update(b"V" + json.dumps(obj).encode())

    feed(text)
    return digest.hexdigest()


def check_same_tokenizer(saved: dict[str, Any] | None, now: dict[str, Any] | None, path: Path) -> None:
    """Refuse a resume whose tokenizer (built from today's files and settings) is not the one last.pt was
    trained with: its ids would mean other words to the trained weights."""
    if tokenizer_hash(saved) != tokenizer_hash(now):
        raise RunDirError(f"cannot resume {path}: the tokenizer built from today's data differs from the one it was "
                          "trained with (a changed file or tokenizer version); resume with the same files again, "
                          "replace the run with train.overwrite=true, or start a new run with another train.out_dir")


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


def final_record(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's end: its last final record (written after its final scores, or without them when
    train.final_eval=false), when no start, training, epoch or step record came after it (a run continued since
    has not ended again); None otherwise."""
    for record in reversed(records):
        kind = record.get("kind")
        if kind == "final":
            return record
        if kind in ("start", "train", "epoch", "step"):
            return None
    return None


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


def _temporary(name: str) -> str | None:
    """The name of the file a temporary of `atomic_write` was for (.last.pt.k2j4x9.tmp -> last.pt), else None."""
    found = TEMPORARY.match(name)
    return found.group("name") if found else None


def _own_temporary(name: str) -> bool:
    """Whether `name` is a temporary of a file training writes in the run folder (.last.pt.k2j4x9.tmp)."""
    target = _temporary(name)
    return target is not None and OWN_NAMES.match(target) is not None


class RunDir:
    """One run directory and its one owner: its paths, its lock, the start / resume / clear decision, its writes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None  # the open .lock while this object holds the folder
        self._made: list[Path] = []  # the folders `lock` created, deepest first: `unlock` removes those left empty
        self._legacy_last: bool | None = None  # whether an unmarked folder's last.pt is ours, once read
        self._legacy_error = ""  # why it is not, when it is not
        self.unguarded: str | None = None  # why `lock` could not lock (a filesystem without locks), else None

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

    def step(self, step: int) -> Path:
        """The weights saved after optimizer step `step` (train.save_every_steps); seven digits, so names sort."""
        return self.path / f"step_{step:07d}.safetensors"

    def epoch_files(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every epoch's weights, oldest first (by number: epoch_100 comes after epoch_99): its
        epoch_NN.safetensors, or the epoch_NN.pt of an older version."""
        return self._numbered("epoch_")

    def step_files(self) -> list[tuple[int, Path]]:
        """(step, path) of every step_NNNNNNN.safetensors model file, oldest first (no older version wrote step
        files, so no other form is one of the project's)."""
        return self._numbered("step_", forms=(".safetensors",))

    def _numbered(self, prefix: str, forms: tuple[str, ...] = (".pt", ".safetensors")) -> list[tuple[int, Path]]:
        """(number, path) of the model files PREFIX<number>, by number; a .safetensors wins over a .pt of its number."""
        found: dict[int, Path] = {}
        for path in [p for form in forms for p in sorted(self.path.glob(f"{prefix}*{form}"))]:
            number = path.stem.removeprefix(prefix)
            if number.isdigit() and OWN_NAMES.match(path.name):  # as training names them: epoch_1 is yours
                found[int(number)] = path
        return sorted(found.items())

    def prune_epochs(self, keep_after: int) -> None:
        """Delete the weight files of epochs up to `keep_after` (train.keep_last_epochs): the model file, and an older
        version's .json beside it or .pt of the same epoch."""
        self._delete([path for epoch, path in self.epoch_files() if epoch <= keep_after], forms=model_file_forms)

    def prune_steps(self, keep: int, newest: int) -> None:
        """Keep the newest `keep` (at least 1) step files, the one of step `newest` (perhaps still being written)
        counted among them: delete the older ones (train.keep_last_steps)."""
        older = [path for step, path in self.step_files() if step < newest]
        self._delete(older[:max(len(older) - (keep - 1), 0)])  # one form: no version wrote a step_N.pt

    def _delete(self, paths: list[Path], forms: Callable[[Path], tuple[Path, ...]] = lambda p: (p,)) -> None:
        """Delete these files (each in its `forms`); a refusal (a read-only disk) is one RunDirError line."""
        for path in paths:
            for old in forms(path):
                with self.writing(old, "delete the older model file"):
                    old.unlink(missing_ok=True)

    @property
    def marker(self) -> Path:
        """The file that says the project made this folder a run's (`prepare` writes it)."""
        return self.path / MARKER

    def entries(self) -> set[str]:
        """Names in the folder (all but .lock, the marker and temporaries of killed writes); empty without a folder."""
        if not self.path.is_dir():
            return set()
        return {p.name for p in self.path.iterdir() if p.name not in (LOCK_FILE, MARKER) and not _own_temporary(p.name)}

    def run_files(self) -> set[str]:
        """The entries that are a run's own files (`OWN_NAMES`)."""
        return {name for name in self.entries() if OWN_NAMES.match(name)}

    def has_run(self) -> bool:
        """True when the folder holds a previous run's files."""
        return bool(self.run_files())

    def owned(self) -> bool:
        """Whether the project made this folder a run's: it carries the marker, or (a run of a version before the
        marker) it holds only a run's files, among them a last.pt that training wrote. Names alone prove nothing:
        other tools write a config.yaml, a metrics.jsonl or a last.pt too."""
        if self.marker.is_file():
            return True
        entries = self.entries()
        return "last.pt" in entries and entries == self.run_files() and self._last_is_ours()

    def _last_is_ours(self) -> bool:
        """Whether last.pt loads as this project's checkpoint (read once a RunDir: only an unmarked folder asks)."""
        if self._legacy_last is None:
            try:
                check_resumable(load_checkpoint(self.last), self.last)
                self._legacy_last = True
            except (UserError, OSError) as exc:
                self._legacy_last, self._legacy_error = False, str(exc)
        return self._legacy_last

    def died_early(self) -> bool:
        """Whether the folder holds only what a run writes before its first checkpoint (it died in its first
        epoch): no file but `STARTED_FILES`, and no epoch, validation or final record in metrics.jsonl. A run
        whose model files were deleted afterwards still has its records: it is not started again unasked."""
        if not self.run_files() <= STARTED_FILES:
            return False
        try:
            return not any(r.get("kind") in ("epoch", "step", "final") for r in self.records())
        except (OSError, UnicodeDecodeError):  # unreadable: keep it, the refusal names train.overwrite
            return False

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
                if exc.errno in _NO_LOCKING:  # e.g. a network filesystem without locks: run unguarded, said once
                    self.unguarded = exc.strerror or str(exc)
                    return
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RunDirError(self._in_use(holder)) from None
                raise run_dir_error(exc, self.lock_file, "lock", self.path) from None
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
            for folder in self._made:
                folder.rmdir()  # only when empty: a run that wrote nothing leaves nothing, nor runs/2026/ above it
        except OSError:
            pass  # a leftover .lock (or folder) is harmless: nothing holds it
        finally:
            self._made = []
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _open_lock_file(self) -> int | None:
        """A read-write descriptor of .lock, made (with the folder) when missing; None when the folder vanished."""
        with self.writing(self.path, "create the run directory"):
            if not self.path.is_dir():
                for folder in reversed([self.path, *(p for p in self.path.parents if not p.exists())]):
                    try:
                        folder.mkdir()
                    except FileExistsError:  # another process made it meanwhile: not ours to remove
                        continue
                    self._made.insert(0, folder)  # deepest first, kept as it goes: a failure halfway leaves none
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

    def open(self, cfg: Config, info: Any, data: Callable[[], dict[str, Any]] | None = None,
             log: Callable[[str], None] | None = None, ready: Callable[[], None] | None = None
             ) -> tuple[str, dict[str, Any] | None]:
        """Take the folder for this training: lock it (rank 0), check that the run can start (`ready`, on every
        rank: e.g. its data files found), remove temporaries of killed writes, decide how the run begins
        (`start_mode`), alike on every rank or an error on all; then, unless the run is finished, make it the
        run's (`prepare`, rank 0). A run that cannot start leaves no folder behind (`unlock` removes the one
        `lock` made).

        Under torchrun each rank reads the folder itself and the ranks compare what they saw, so a node that
        sees no last.pt (a folder that is not shared) never starts from step 0 while another resumes.
        """
        start_mode, last = self._decide(cfg, info, data, ready)
        if self.unguarded and log is not None:
            log(f"warning: cannot lock {self.lock_file} ({self.unguarded}: its filesystem has no file locks); nothing "
                "stops a second training on this folder, so start one at a time")
        if info.is_main and start_mode != "finished":
            self.prepare(cfg, start_mode, log)
        return start_mode, last

    def _decide(self, cfg: Config, info: Any, data: Callable[[], dict[str, Any]] | None,
                ready: Callable[[], None] | None) -> tuple[str, dict[str, Any] | None]:
        """`open`'s decision: the folder locked (rank 0), the run's checks, the folder tidied (rank 0), `start_mode`
        on every rank, compared."""
        with ranks_agree(info, f"use {self.path}"):  # every rank stops here when rank 0 cannot take the folder
            if info.is_main:
                self.refuse_foreign()  # before the lock file is made or anything removed: not a run's folder
                self.lock()  # before reading: train.overwrite=true must not empty a folder a live run writes to
        failure: UserError | None = None
        try:
            if ready is not None:  # under the lock: a live run's folder is refused before its data is built
                ready()
            if info.is_main:
                self.remove_temporaries()
            start_mode, last = self.start_mode(cfg, data)
            mine: tuple[Any, ...] = (start_mode, (last or {}).get("train_state", {}).get("step", 0), "")
        except UserError as exc:
            if not info.distributed:
                raise
            failure, mine = exc, ("", 0, str(exc))
        if not info.distributed:
            return start_mode, last
        seen: list[Any] = [None] * info.world_size
        dist.all_gather_object(seen, mine)  # a barrier too: nobody writes before everybody has looked
        if failure is not None:
            raise failure
        failed = [(rank, msg) for rank, (_, _, msg) in enumerate(seen) if msg]
        if failed:
            raise DistributedError(f"rank {failed[0][0]} could not use {self.path}: {failed[0][1]}")
        if len({(mode, step) for mode, step, _ in seen}) > 1:
            what = {"start": "start afresh", "resume": "resume", "finished": "find a finished run"}
            views = ", ".join(f"rank {rank} would {what[mode]} at step {step}"
                              for rank, (mode, step, _) in enumerate(seen))
            raise DistributedError(f"the ranks see {self.path} differently ({views}); train.out_dir must be one "
                                   "folder that every node reads and writes (a shared filesystem)")
        return start_mode, last

    def start_mode(self, cfg: Config, data: Callable[[], dict[str, Any]] | None = None
                   ) -> tuple[str, dict[str, Any] | None]:
        """How a training begins in this folder: ('start', None), ('resume', last.pt) or ('finished', last.pt).

        A folder the project did not make a run's and that is not empty is refused whatever the keys say.
        `train.resume=auto` continues a run whose last.pt has the same model and data settings, and the same
        data files (`data()`, the `data_fingerprint` of today's files, read only here), and leaves a finished
        one as it is (finished: its final record written; one stopped in its final evaluation resumes to it);
        `true` insists on last.pt; `false` refuses any earlier run; `train.overwrite=true` starts again
        (`prepare` deletes the run's own files only). A folder that holds only what a run writes before its
        first checkpoint (it died in its first epoch) starts again. Anything else raises one line.
        """
        t = cfg.train
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(self._not_a_folder())
        if self.entries() and not self.owned():
            raise RunDirError(self._not_a_run())
        if t.resume is True and not self.last.is_file():
            raise ConfigError(f"train.resume=true but {self.last} does not exist; start a new run without "
                              "train.resume")
        if t.overwrite or not self.has_run():
            return "start", None
        if t.resume is False:
            raise ConfigError(f"run directory {self.path} already holds a run; continue it with train.resume=auto, "
                              "replace it with train.overwrite=true, or choose another train.out_dir")
        if not self.last.is_file():
            if self.died_early():
                return "start", None
            raise ConfigError(f"run directory {self.path} holds a run's files but no last.pt, so it cannot be "
                              "continued; start it again with train.overwrite=true (which deletes only the files "
                              "training wrote) or choose another train.out_dir")
        last = load_checkpoint(self.last)
        check_resumable(last, self.last)
        recorded = data is not None and isinstance(last.get("data"), dict)
        check_same_settings(last.get("config", {}), cfg, self.last, files_checked=recorded)
        if recorded:
            check_same_data(last["data"], data(), self.last)
        if last.get("config", {}).get("train", {}).get("target_bleu", 0.0) != t.target_bleu:
            last["train_state"] = retarget(last.get("train_state", {}), self.records(), t.target_bleu)
        state = last.get("train_state", {})
        done = t.finished(state.get("epoch", 0), state.get("step", 0), state.get("target_epoch") is not None)
        # trained to its end, but stopped in its final evaluation (no final record): resumed, it finishes that
        return ("finished" if done and t.resume == "auto" and self.has_final(state.get("step", 0)) else "resume"), last

    def refuse_foreign(self) -> None:
        """One line, touching nothing, for a folder of someone else's files: a name training never writes, or a .lock
        training did not write, makes it foreign unless the project made it a run's (`start_mode` judges the rest
        under the lock)."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(self._not_a_folder())
        if not self.path.is_dir() or self.owned():
            return
        # a run's own names (a live or legacy run's, decided under the lock) and its temporaries are not foreign
        names = {p.name for p in self.path.iterdir() if not _own_temporary(p.name)}
        foreign = {name for name in names if not OWN_NAMES.match(name)}
        if foreign or (LOCK_FILE in names and not self._lock_file_is_ours()):
            raise RunDirError(self._not_a_run())

    def _lock_file_is_ours(self) -> bool:
        """Whether .lock is one training wrote: empty (made, not yet written) or the JSON of a pid and a host."""
        try:
            text = self.lock_file.read_text(encoding="utf-8").strip()
            return not text or set(json.loads(text)) == {"pid", "host"}
        except (OSError, ValueError, TypeError):
            return False

    def _not_a_run(self) -> str:
        """The refusal for a folder of someone else's files: never an offer to overwrite them."""
        everything = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
        foreign = sorted(self.entries() - self.run_files())
        names = foreign or sorted(self.entries()) or sorted(everything)
        shown = listed(names)
        choose = ("training never writes into such a folder: choose a new train.out_dir (a folder that does not "
                  "exist yet, or an empty one)")
        if foreign or not self.entries():
            return f"train.out_dir {self.path} holds files this project did not write ({shown}); {choose}"
        why = f" ({self._legacy_error})" if self._legacy_error else ""
        return (f"train.out_dir {self.path} holds files named as a run's ({shown}) but nothing shows that this project "
                f"wrote them (no {MARKER} marker, no last.pt of its own{why}); {choose}, or delete them yourself if "
                "they are an old run of yours")

    def prepare(self, cfg: Config, start_mode: str, log: Callable[[str], None] | None = None) -> None:
        """Make the folder a run's (created, the marker written; a fresh start deletes the run's own files there).
        Its config.yaml and vocab/ are written once the run has begun (`save_settings`)."""
        if self.entries() and not self.owned():  # start_mode refused it already; a last check before any write
            raise RunDirError(self._not_a_run())
        with self.writing(self.path, "create the run directory"):
            self.path.mkdir(parents=True, exist_ok=True)
            if start_mode == "start" and self.has_run():  # train.overwrite, or a run that died before last.pt
                if not (cfg.train.overwrite or self.died_early()):
                    raise RunDirError(f"run directory {self.path} holds a run; decide with RunDir.open (it continues "
                                      "the run, or clears it only with train.overwrite=true)")
                deleted, kept = self._clear()
                if log is not None and deleted:
                    why = "train.overwrite" if cfg.train.overwrite else "a new start (the run ended before last.pt)"
                    log(f"{why}: deleted the earlier run's files in {self.path} ({listed(deleted, 6)})"
                        + (f", kept what training did not write ({', '.join(sorted(kept))})" if kept else ""))
        if not self.marker.is_file():
            mark = {"format": MARKER_FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            self._write_text(self.marker, json.dumps(mark) + "\n")

    @contextmanager
    def writing(self, path: Path, what: str = "write") -> Iterator[None]:
        """An OSError inside the block as one RunDirError line about this run's `path` (a full disk: how to resume)."""
        try:
            yield
        except OSError as exc:
            raise run_dir_error(exc, path, what, self.path) from None  # the one line, which runtime.files words

    def _write_text(self, path: Path, text: str) -> None:
        """Replace one of the run's text files atomically; a full disk or a refused write is one RunDirError line."""
        with self.writing(path):
            atomic_write(path, lambda f: f.write(text.encode("utf-8")))

    def _clear(self) -> tuple[list[str], set[str]]:
        """Delete the run's own files (`OWN_NAMES`; inside its folders, only the files `INSIDE` names) but .lock and
        the marker; returns what it deleted (NAME or FOLDER/NAME) and the names it kept (a folder of the run's that
        holds someone else's files among them)."""
        deleted, kept = [], set()
        for name in sorted(self.run_files()):
            child = self.path / name
            if child.is_dir() and not child.is_symlink():
                for inner in self._own_files_in(name):
                    inner.unlink()
                    deleted.append(f"{name}/{inner.name}")
                try:
                    child.rmdir()
                except OSError:  # what is left is not the run's: the folder stays, with it
                    kept.add(name)
            else:
                child.unlink()
                deleted.append(name)
        return deleted, (self.entries() - self.run_files()) | kept

    def _own_files_in(self, folder: str) -> list[Path]:
        """The files training wrote in the run's `folder` (vocab/, charts/, ...: `INSIDE`) and the temporaries of its
        killed writes there; never a folder, never a name training does not write."""
        names, path = INSIDE.get(folder), self.path / folder
        if names is None or not path.is_dir():
            return []
        return [child for child in path.iterdir()
                if (child.is_file() or child.is_symlink()) and names.match(_temporary(child.name) or child.name)]

    def remove_temporaries(self) -> list[Path]:
        """Delete what killed writes of this project left (.NAME.RANDOM.tmp beside a file training writes, in the
        folder and in vocab/ and charts/); call it holding the lock, when no writer of this run can be live."""
        if not self.owned() and self.entries():  # never in someone else's folder (refuse_foreign said so already)
            return []
        leftovers = [child for child in self.path.iterdir() if _own_temporary(child.name) and child.is_file()]
        leftovers += [p for name in ("vocab", "charts") for p in self._own_files_in(name) if _temporary(p.name)]
        for leftover in leftovers:
            with self.writing(leftover, "remove the leftover"):
                leftover.unlink()
        return leftovers

    def save_settings(self, cfg: Config, text: Any) -> None:
        """The resolved config in config.yaml and the run's TextPipeline (vocabularies, SentencePiece model; None for
        the copy task) in vocab/, what translating reads: written when the run has begun, after a resume's checks,
        so that a refused resume leaves the run's files as they were."""
        self._write_text(self.config, config_yaml(cfg))
        if text is not None:
            with self.writing(self.vocab):
                text.save(self.vocab)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line (with a wall-clock time stamp) to metrics.jsonl."""
        record = {**record, "time": round(time.time(), 3)}
        with self.writing(self.metrics), self.metrics.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def has_final(self, step: int | None = None) -> bool:
        """Whether the run got to its end: metrics.jsonl ends with its final record (`final_record`), written at
        optimizer step `step` when given (last.pt's: an older end of a run continued since is not this one)."""
        try:
            final = final_record(self.records())
            return final is not None and (step is None or int(final.get("step", -1)) == step)
        except (OSError, UnicodeDecodeError, ValueError, TypeError):  # unreadable, or a step edited by hand
            return False

    def records(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl (empty when missing), as `read_metrics` reads them."""
        return read_metrics(self.metrics) if self.metrics.is_file() else []

    def truncate_metrics(self, step: int) -> None:
        """Drop records logged after optimizer step `step` (a resumed run logs them again), and any final record: a
        resumed run writes its own at its new end."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step and r.get("kind") != "final"]
        self._write_text(self.metrics, "".join(json.dumps(r) + "\n" for r in kept))
