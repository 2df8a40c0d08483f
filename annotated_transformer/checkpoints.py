"""Model files and checkpoints: their formats, atomic writes, safe loads and parameter averaging.

The one module that owns the files a model is stored in, below both the harness (which writes them
while training) and deploy/ (which loads them to translate).

A model a user ships (a run's best, avg and epoch_NN, and what average-checkpoints writes) is ONE
file, NAME.safetensors, that loads without unpickling anything:

    tensors       the unique tensors of the model's state_dict, at their own dtype; a tied matrix (tied
                  embeddings: source, target and generator) is stored once
    __metadata__  str -> str:
        format         "annotated-transformer/model/1"
        config         the resolved config (JSON)
        text           the TextPipeline's state_dict (JSON, its SentencePiece model in base64; null for
                       the copy task)
        train_state    how far training got: TrainState's and the harness's RunCounters' fields, one dict (JSON)
        averaged_from  the files an average was made of (JSON), for an average
        tied           {alias: stored name} for the names that share a tensor (JSON)
        order          every name in the state_dict's order (JSON): safetensors keeps no order
        sha256         of the tensor data (the bytes after the header), so a damaged file is refused

It is written with one atomic rename: a reader sees the old model or the new one, never half of one.

Older files still load:

    NAME.safetensors + NAME.json   the pair of earlier versions: the .safetensors' metadata holds only
                                   "format" ("annotated-transformer/weights/1"), "tied" and "order"; the
                                   JSON {"format", "sha256" (of the whole .safetensors), "config", "text",
                                   "train_state", "averaged_from"}
    best.pt, avg.pt, epoch_NN.pt   the torch.save dicts of the versions before model files (below)

last.pt (what resuming needs) is a dict that `torch.load(weights_only=True)` reads (tensors, numbers,
strings, lists, dicts): nothing in it needs arbitrary unpickling, and a file that does is refused.
Keys:

    format       "annotated-transformer/1"
    config       the resolved config (nested dict)
    model        the model's state_dict (unwrapped from DDP / torch.compile); with ema.decay on, the model
                 files hold the weight average, last.pt the raw weights
    ema          last.pt only, with ema.decay on: the weight average (extensions/ema.py)
    text         the TextPipeline's state_dict (vocabulary, tokenizer settings), or None (copy task)
    train_state  TrainState's and the harness's RunCounters' fields in one flat dict (step, epoch, clocks, ...)
    optimizer, scheduler, loader, rng    only in resumable checkpoints (last.pt)

`load_checkpoint` reads any of them into that dict; `model_file` says which file a name means.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import threading
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from .config import MODEL_EXTENSIONS, Config, apply_dict
from .loop import unwrap_model
from .runtime.errors import CheckpointError, ConfigError, excerpt
from .runtime.files import atomic_write, refuse_to_replace, run_dir_error, same_file, writing

CHECKPOINT_FORMAT = "annotated-transformer/1"
MODEL_FORMAT = "annotated-transformer/model/1"  # one NAME.safetensors: weights, config and vocabulary
PAIR_FORMAT = "annotated-transformer/weights/1"  # an older version's NAME.safetensors + NAME.json (read only)
MODEL_SUFFIX = ".safetensors"
PAIR_SUFFIX = ".json"  # the second file of an older version's pair

# Metadata entries about the file itself; every other entry of a model file's metadata is a payload value as JSON.
_FILE_KEYS = ("format", "tied", "order", "sha256")
# Written in the sha256 entry first, then replaced by the digest: one serialisation, the same header length.
_PLACEHOLDER = "0" * 64


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write a checkpoint dict atomically (temporary file, fsync, rename); a failed write is an OSError."""
    payload = {**payload, "format": CHECKPOINT_FORMAT}  # this file's format, whatever the payload was read from
    try:
        atomic_write(path, lambda f: torch.save(payload, f))
    except RuntimeError as exc:
        failure = write_failure(exc, path)
        if failure is None:
            raise
        raise failure from exc


# What torch's zip writer says when the bytes did not reach the file: its own check of the file position
# ("unexpected pos", seen with a Python file on a full disk), or its stream's failure (with a path).
_WRITE_FAILED = ("unexpected pos", "file write failed", "failed writing file", "iostream error")


def write_failure(exc: RuntimeError, path: str | Path) -> OSError | None:
    """The OSError behind torch.save's RuntimeError when writing the file failed; None for other errors.

    torch reports a failed write as a RuntimeError without errno: the OSError that Python's file raised
    is found in its context when there is one, else a full disk is told by the free space left.
    """
    if not any(marker in str(exc) for marker in _WRITE_FAILED):
        return None
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            return cause
        cause = cause.__cause__ or cause.__context__
    try:
        full = shutil.disk_usage(Path(path).parent).free < (1 << 20)
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return OSError(errno.EIO, f"the write failed ({first[:160]})", str(path))


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What makes two tensors one: the same memory seen the same way (tied weights, detached views of one)."""
    if t.device.type == "meta":  # no memory to compare: only the same object is the same tensor
        return ("meta", id(t))
    return (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())


def _cpu_copy(obj: Any, memo: dict[Any, torch.Tensor] | None = None) -> Any:
    """`obj` with every tensor copied to the CPU: a snapshot that later training steps cannot change.

    `memo` maps tensors already copied (by their memory, `_tensor_key`) to their copy, so payloads that
    share the model's weights (last.pt and best at an epoch's end) copy them once, and names that share
    one tensor (tied embeddings; a state_dict gives each name its own detached view) share the copy.
    """
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = _tensor_key(obj)
        if key not in memo:
            memo[key] = obj.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(obj, dict):
        return {k: _cpu_copy(v, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v, memo) for v in obj)
    return obj  # numbers, strings, None: immutable


def _named(path: str | Path) -> Path:
    """NAME.safetensors for NAME, NAME.safetensors, or the NAME.json of an older pair."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (MODEL_SUFFIX, PAIR_SUFFIX) else path
    return stem.with_name(stem.name + MODEL_SUFFIX)


def is_model_file(path: str | Path) -> bool:
    """Whether `path` names a model file (by its suffix, the older pair's .json included), not a .pt checkpoint."""
    return Path(path).suffix in (MODEL_SUFFIX, PAIR_SUFFIX)


def model_file(path: str | Path) -> Path:
    """The file a name means: a model file's NAME.safetensors (the older pair's NAME.json names it too), or a .pt file.

    Where the file named is gone, the other format of the same stem stands in: an older version's best.pt for
    runs/x/best.safetensors, the model file that took its place for runs/x/best.pt. Neither there: the name itself
    (a .json as its .safetensors), for the loader to report.
    """
    path = Path(path)
    if path.suffix == ".pt":
        new = _named(path.with_suffix(""))
        return new if not path.exists() and new.is_file() else path
    if path.suffix == PAIR_SUFFIX:
        return _named(path)
    if path.suffix == MODEL_SUFFIX and not path.exists() and path.with_suffix(".pt").is_file():
        return path.with_suffix(".pt")
    return path


def model_file_forms(path: str | Path) -> tuple[Path, Path, Path]:
    """Every file a model of this name may be stored in: NAME.safetensors, an older pair's NAME.json, older NAME.pt."""
    new = _named(Path(path).with_suffix("") if Path(path).suffix == ".pt" else path)
    return new, new.with_suffix(PAIR_SUFFIX), new.with_suffix(".pt")


def tied_names(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """{alias: the first name holding the same tensor} for the names of `state` that share one (tied weights)."""
    first: dict[Any, str] = {}
    ties = {}
    for name, tensor in state.items():
        key = _tensor_key(tensor)
        if tensor.numel() and key in first:  # empty tensors may all sit at one address
            ties[name] = first[key]
        else:
            first.setdefault(key, name)
    return ties


def _equal_matrices(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """{alias: first name} for matrices of `state` equal in value to an earlier one.

    Checkpoints written before ties were kept hold each tied matrix as its own copy; in a model with
    tied embeddings those copies are the only matrices that are equal (every matrix starts random).
    """
    seen: dict[Any, list[str]] = {}
    ties = {}
    for name, tensor in state.items():
        if tensor.dim() < 2 or not tensor.is_floating_point():
            continue
        key = (tensor.dtype, tuple(tensor.shape), tuple(tensor.reshape(-1)[:8].tolist()))
        twin = next((n for n in seen.get(key, []) if torch.equal(state[n], tensor)), None)
        if twin is None:
            seen.setdefault(key, []).append(name)
        else:
            ties[name] = twin
    return ties


def _text_to_json(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """A TextPipeline state_dict as JSON values: its SentencePiece model (bytes) in base64."""
    if text is None or text.get("spm_model") is None:
        return text
    model = text["spm_model"]
    raw = model.cpu().numpy().tobytes() if isinstance(model, torch.Tensor) else bytes(model)
    return {**text, "spm_model": base64.b64encode(raw).decode("ascii")}


def _text_from_json(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`_text_to_json` undone: the SentencePiece model as the uint8 tensor a .pt checkpoint holds."""
    if not isinstance(text, dict) or not isinstance(text.get("spm_model"), str):
        return text
    raw = base64.b64decode(text["spm_model"], validate=True)
    return {**text, "spm_model": torch.frombuffer(bytearray(raw), dtype=torch.uint8)}


def save_model_file(payload: dict[str, Any], path: str | Path) -> Path:
    """Write a weights payload (config, model, text, train_state) as one model file, atomically; returns its path."""
    target = _named(path)
    state = payload["model"]
    ties = tied_names(state)
    tensors = {name: _own_memory(t) for name, t in state.items() if name not in ties}
    values = {k: v for k, v in payload.items() if k not in ("model", *_FILE_KEYS)}
    values["text"] = _text_to_json(payload.get("text"))
    metadata = {key: json.dumps(value, ensure_ascii=False) for key, value in values.items()}
    # The names in the state_dict's order: safetensors hands its tensors back in no fixed order.
    metadata |= {"format": MODEL_FORMAT, "tied": json.dumps(ties), "order": json.dumps(list(state))}
    head, data = _serialise(tensors, metadata)
    atomic_write(target, lambda f: (f.write(head), f.write(data)))
    return target


def _serialise(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> tuple[bytes, memoryview]:
    """A safetensors file in two parts: its header (the SHA-256 of the tensor data in its metadata) and that data."""
    raw = safetensors.torch.save(tensors, {**metadata, "sha256": _PLACEHOLDER})
    start = 8 + int.from_bytes(raw[:8], "little")
    data = memoryview(raw)[start:]
    digest = hashlib.sha256(data).hexdigest()
    # safetensors writes its header as compact JSON, each key once: the placeholder is replaced in place (the same
    # length), so the offsets stay right; any other spelling is serialised again, which lays the data out alike.
    marker = f'"sha256":"{_PLACEHOLDER}"'.encode()
    head = raw[:start]
    if head.count(marker) == 1:
        return head.replace(marker, f'"sha256":"{digest}"'.encode()), data
    raw = safetensors.torch.save(tensors, {**metadata, "sha256": digest})
    start = 8 + int.from_bytes(raw[:8], "little")
    return raw[:start], memoryview(raw)[start:]


def _own_memory(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU with memory of its own: safetensors refuses tensors that share memory (views of one)."""
    t = tensor.detach().to("cpu").contiguous()
    whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def write_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write `payload` in the format `path` names: a model file (.safetensors), else a .pt file."""
    if is_model_file(path):
        save_model_file(payload, path)
    else:
        save_checkpoint(payload, path)


def copy_checkpoint(source: str | Path, target: str | Path) -> None:
    """Copy a file written by `write_checkpoint` atomically (one file in either format)."""
    with open(source, "rb") as src:
        atomic_write(target, lambda f: shutil.copyfileobj(src, f, 16 << 20))


class CheckpointWriter:
    """Writes checkpoints on a background thread, so training goes on while the bytes reach the disk.

    The base model's last.pt (weights plus Adam's two moments) is about 0.65 GB; written in the
    foreground every epoch, it would cost seconds of a GPU epoch that itself takes seconds.
    `save` snapshots its payloads (tensors copied to the CPU, shared ones once), so what is
    written is the state at the moment of the call, and returns at once; the files are written
    by `write_checkpoint` (atomic), a payload to its first path and copied to the others. Writes
    land in call order. A `save` waits only while the previous one is still being written (one
    snapshot in memory at a time). `wait` blocks until every write is on disk and raises the
    error of one that failed (an OSError as a one-line RunDirError naming the file).
    """

    def __init__(self, run: str | Path | None = None) -> None:
        self.run = run  # the run directory, named (with the way to go on) when its disk is full
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, *jobs: tuple[dict[str, Any], Sequence[str | Path]], then: Callable[[], None] | None = None) -> None:
        """Queue each (payload, paths) job: the payload is written to every path in `paths`; then `then` runs on the
        writer's thread, once every file is on disk (never after a failed write): what deletes older files."""
        self.wait()
        memo: dict[Any, torch.Tensor] = {}
        snapshots = [(_cpu_copy(payload, memo), tuple(paths)) for payload, paths in jobs]
        self._thread = threading.Thread(target=self._run, args=(snapshots, then), name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Block until queued writes are done; re-raise the error of one that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def finished(self) -> bool:
        """Whether the last queued writes have ended (on disk, or failed: `wait` then raises at once)."""
        return self._thread is None or not self._thread.is_alive()

    def _run(self, snapshots: list[tuple[dict[str, Any], tuple[str | Path, ...]]],
             then: Callable[[], None] | None) -> None:
        target: str | Path = ""
        try:
            for snapshot, (first, *rest) in snapshots:
                # torch.save straight into the file: serialising into an in-memory buffer instead held
                # the GIL throughout and slowed the training thread's Python ten-fold meanwhile (measured).
                target = first
                write_checkpoint(snapshot, first)
                for target in rest:
                    copy_checkpoint(first, target)
            if then is not None:
                then()
        except OSError as exc:
            self._error = run_dir_error(exc, target, run=self.run)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = exc


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a model file (or an older pair) or a .pt checkpoint (`weights_only=True`) as a checkpoint dict; every
    failure is one clear CheckpointError."""
    path = model_file(path)
    if is_model_file(path):
        return load_model_file(path, map_location)
    if not path.is_file():
        if path.is_dir():
            raise CheckpointError(f"checkpoint {path} not found (it is a directory; name a .safetensors or .pt file "
                                  "in it)")
        if path.exists():  # /dev/null, a pipe: there, but no file to load
            raise CheckpointError(f"checkpoint {path} is not a file (a device, pipe or socket); name a .safetensors "
                                  "or .pt file written by training")
        raise CheckpointError(f"checkpoint {path} not found")
    kind = not_a_checkpoint(path)
    if kind is not None:
        raise CheckpointError(f"{path} is {kind}, not a checkpoint: pass {pass_instead(path.parent)}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))  # torch names the first object it refused
        what = f"it holds a {found.group(1)} object" if found else excerpt(str(exc).split("error:")[-1])
        raise CheckpointError(f"checkpoint {path} needs arbitrary unpickling, which is refused for safety ({what}); "
                              "re-save it as a plain dict of tensors") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable or truncated ({excerpt(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT or "model" not in payload:
        raise CheckpointError(f"{path} is not an annotated-transformer checkpoint "
                              f"(no '{CHECKPOINT_FORMAT}' format tag)")
    return payload


# A file's kind by its name, for a --checkpoint that names something else (its run's config, its metrics).
_KINDS = {".yaml": "a YAML file", ".yml": "a YAML file", ".json": "a JSON file", ".jsonl": "a JSON-lines file",
          ".txt": "a text file", ".md": "a Markdown file", ".log": "a log file", ".csv": "a CSV file",
          ".html": "an HTML page", ".png": "a PNG image", ".gz": "a gzip file", ".tar": "a tar archive"}


def not_a_checkpoint(path: Path) -> str | None:
    """What `path` is (e.g. 'a YAML file') when its first bytes and its name show it is no torch checkpoint;
    None when it may be one (a zip archive holding data.pkl, as torch.save writes, or a pickle), or cannot be read.

    Cheap: a few hundred bytes and, for a zip archive, its list of names; torch.load's messages about such
    files speak of unpickling and safety instead.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None  # torch.load's error says why
    if not head:
        return "an empty file (0 bytes)"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return None  # a damaged torch file too: torch.load calls it truncated
        return None if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names) else "a zip archive"
    if head.startswith(b"\x80"):  # a pickle: torch's older format
        return None
    if path.suffix.lower() in _KINDS:
        return _KINDS[path.suffix.lower()]
    if head.startswith(b"\x1f\x8b"):
        return "a gzip file"
    try:  # a multi-byte character may be cut at the end of the head
        text = head[:-3].decode("utf-8") if len(head) == 512 else head.decode("utf-8")
    except UnicodeDecodeError:
        return "a file of another format"
    return "a JSON file" if text.lstrip().startswith(("{", "[")) else "a text file"


def pass_instead(folder: Path) -> str:
    """What to give instead of a file in `folder` that is no checkpoint: its run or exported folder, when it is one."""
    if (folder / "metrics.jsonl").is_file():
        return f"the run directory {folder} or one of its checkpoint files"
    if (folder / "model.bin").is_file():
        return f"the exported model folder {folder} (translate and evaluate take it), or a checkpoint file"
    return "a run directory or a checkpoint file written by training"


def load_model_file(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A model file (`save_model_file`, or an older pair) as a checkpoint dict, tied names sharing one tensor again.

    Nothing is unpickled: the tensors come from safetensors, the rest from JSON. A missing, damaged, truncated
    or crafted file is one CheckpointError naming it.
    """
    weights = _named(path)
    settings = weights.with_suffix(PAIR_SUFFIX)
    if not weights.is_file():
        if settings.is_file() and not _is_pair_settings(settings):  # a JSON file of another kind (a vocabulary)
            raise CheckpointError(f"{settings} is a JSON file, not a model file: pass {pass_instead(settings.parent)}")
        if settings.is_file():
            raise CheckpointError(f"{weights} is missing: {settings.name} is the other half of an older model file, "
                                  "which needs the .safetensors written beside it; copy both files")
        raise CheckpointError(f"checkpoint {weights} not found")
    try:
        data = weights.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{weights} is unreadable ({excerpt(exc)})") from None
    metadata, start = _header(data, weights)
    kind = metadata.get("format")
    if kind == MODEL_FORMAT:
        if hashlib.sha256(memoryview(data)[start:]).hexdigest() != metadata.get("sha256"):
            raise _damaged(weights, "its tensor data does not match the SHA-256 its metadata records")
        doc = {key: _metadata_json(metadata, key, weights) for key in metadata if key not in _FILE_KEYS}
        values = _checked_values(doc, f"{weights}'s metadata", weights)
    elif kind == PAIR_FORMAT:
        values = _checked_values(_pair_settings(weights, settings, data), str(settings), weights)
    else:
        raise CheckpointError(f"{weights} is a safetensors file but not an annotated-transformer model file (no "
                              f"'{MODEL_FORMAT}' format tag in its metadata): pass a model file written by training")
    try:
        tensors = safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, TypeError) as exc:
        raise _damaged(weights, excerpt(exc)) from None
    ties = _metadata_json(metadata, "tied", weights, {})
    order = _metadata_json(metadata, "order", weights, [])
    if not isinstance(ties, dict) or not all(isinstance(v, str) for v in ties.values()):
        raise _damaged(weights, f"its metadata's 'tied' is a {type(ties).__name__}, not a mapping of names")
    if not isinstance(order, list) or not all(isinstance(name, str) for name in order):
        raise _damaged(weights, "its metadata's 'order' is not a list of names")
    state = {name: t.to(map_location) for name, t in sorted(tensors.items())}
    missing = sorted(set(ties.values()) - set(state))
    if missing:
        raise _damaged(weights, f"the tied name {missing[0]} has no tensor")
    state.update({alias: state[name] for alias, name in ties.items()})
    if sorted(order) == sorted(state):
        state = {name: state[name] for name in order}
    return {**values, "format": kind, "model": state}


def _damaged(weights: Path, what: str) -> CheckpointError:
    """The one line for a model file whose bytes or metadata are not what training writes."""
    return CheckpointError(f"{weights} is damaged or truncated ({what}); copy it again, or use another checkpoint "
                           "of the run (an epoch file, last.pt)")


def _header(data: bytes, weights: Path) -> tuple[dict[str, str], int]:
    """A safetensors file's metadata (str -> str) and where its tensor data starts, read by hand: a crafted header is
    one line, and the data's offset is what its SHA-256 covers."""
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 <= size <= len(data) - 8:
        raise _damaged(weights, f"its header claims {size} bytes of a {len(data)}-byte file" if size >= 0
                       else "shorter than a safetensors header")
    try:
        header = json.loads(data[8:8 + size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise _damaged(weights, f"its header is not JSON: {excerpt(exc)}") from None
    metadata = (header.get("__metadata__") or {}) if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _damaged(weights, "its header holds no metadata of strings")
    return metadata, 8 + size


def _metadata_json(metadata: dict[str, str], key: str, weights: Path, default: Any = None) -> Any:
    """A metadata entry's JSON value (`default` when absent); a value that is not JSON is one line."""
    if key not in metadata:
        return default
    try:
        return json.loads(metadata[key])
    except ValueError as exc:
        raise _damaged(weights, f"its metadata's '{key}' is not JSON: {excerpt(exc)}") from None


def _pair_settings(weights: Path, settings: Path, data: bytes) -> dict[str, Any]:
    """The JSON beside an older version's .safetensors (its config, vocabulary, counters), checked against its
    SHA-256 of the .safetensors."""
    if not settings.is_file():
        raise CheckpointError(f"{settings} is missing: {weights.name} is an older model file whose config and "
                              "vocabulary are in the JSON written beside it; copy both files")
    try:
        doc = json.loads(settings.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{settings} is unreadable ({excerpt(exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != PAIR_FORMAT:
        raise CheckpointError(f"{settings} is not the JSON of a model file (no '{PAIR_FORMAT}' format tag), which "
                              f"{weights.name} needs beside it; copy both files of the model again")
    if hashlib.sha256(data).hexdigest() != doc.get("sha256"):
        raise _damaged(weights, f"its SHA-256 is not the one {settings.name} records, so either file changed since "
                       "they were written together")
    return {k: v for k, v in doc.items() if k not in ("format", "sha256")}


def _checked_values(doc: dict[str, Any], where: str, weights: Path) -> dict[str, Any]:
    """A model file's values (config, text, train_state, averaged_from) checked for their kinds, the SentencePiece
    model decoded; `where` (its metadata, or an older pair's JSON) is named in the one line for a wrong one."""
    def wrong(what: str) -> CheckpointError:
        return CheckpointError(f"{where} is damaged or was not written by training ({what}); copy {weights.name} "
                               "again, or use another checkpoint of the run (an epoch file, last.pt)")

    for key, kinds, name in (("config", (dict,), "a mapping"), ("text", (dict, type(None)), "a mapping or null"),
                             ("train_state", (dict,), "a mapping"), ("averaged_from", (list,), "a list")):
        if key == "config" and doc.get(key) is None:
            raise wrong("it holds no config")
        if key in doc and not isinstance(doc[key], kinds):
            raise wrong(f"its {key} is a {type(doc[key]).__name__}, not {name}")
    try:
        text = _text_from_json(doc.get("text"))
    except ValueError as exc:  # binascii.Error: not base64
        raise wrong(f"its SentencePiece model is not base64: {excerpt(exc)}") from None
    return {**doc, "train_state": doc.get("train_state", {}), "text": text}


def _is_pair_settings(path: Path) -> bool:
    """Whether `path` is the JSON of an older model file pair (its format tag), read as little as a look needs."""
    try:
        with open(path, "rb") as f:
            head = f.read(200)
    except OSError:
        return False
    return f'"format": "{PAIR_FORMAT}"'.encode() in head


def model_payload(model: nn.Module, config: dict[str, Any], text_state: dict[str, Any] | None,
                  train_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The part of a checkpoint that evaluation and translation need (no optimizer state)."""
    return {"config": config, "model": unwrap_model(model).state_dict(), "text": text_state,
            "train_state": train_state or {}}


# The config sections that shape the model (the training-only extensions do not).
ARCHITECTURE_SECTIONS = ("model", *MODEL_EXTENSIONS)


def _architecture(config: dict[str, Any]) -> list[Any]:
    """A checkpoint config's model-shaping sections, read as today's Config (older checkpoints compare alike)."""
    cfg = apply_dict(Config(), config, source="checkpoint config")
    return [getattr(cfg, section) for section in ARCHITECTURE_SECTIONS]


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Average the model parameters of several checkpoints of one architecture and vocabulary.

    Returns a weights payload (config, text and train_state from the last file) whose tied names
    share one averaged tensor, as the inputs' do.
    """
    if len(paths) < 1:
        raise CheckpointError("no checkpoints given to average")
    for i, path in enumerate(paths):  # a file given twice would weigh twice in a mean meant to be even
        twin = next((p for p in paths[:i] if same_file(model_file(p), model_file(path))), None)
        if twin is not None:
            raise CheckpointError(f"{path} is the same file as {twin}, given earlier; give each checkpoint once")
    first = load_checkpoint(paths[0])
    ref_model_cfg = _architecture(first["config"])
    ref_text = first.get("text")
    # Tied names share a tensor in model files; an older .pt file held copies, found by value then.
    ties = tied_names(first["model"]) or (_equal_matrices(first["model"]) if _ties_embeddings(first) else {})
    summed = {k: v.clone().double() if v.is_floating_point() else v.clone()
              for k, v in first["model"].items() if k not in ties}
    last, first_run = first, _run_of(first)
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        (seed, folder), (seed0, folder0) = _run_of(ckpt), first_run
        if seed != seed0 and (folder != folder0 or folder is None):
            warnings.warn(f"{path} comes from another run than {paths[0]} (train.seed={seed} in {folder}, not "
                          f"{seed0} in {folder0}): the weights of two runs average to a model worse than either; "
                          "average checkpoints of one run", TwoRunsWarning, stacklevel=2)
        if _architecture(ckpt["config"]) != ref_model_cfg:
            raise CheckpointError(f"{path} has a different architecture from {paths[0]} (config 'model' differs); "
                                  "only checkpoints of one run can be averaged")
        if not _same_text(ckpt.get("text"), ref_text):
            raise CheckpointError(f"{path} has a different vocabulary from {paths[0]}; "
                                  "only checkpoints of one run can be averaged")
        if ckpt["model"].keys() != first["model"].keys():
            raise CheckpointError(f"{path} has different parameter names from {paths[0]}")
        for k, total in summed.items():
            v = ckpt["model"][k]
            if v.shape != total.shape:
                raise CheckpointError(f"{path}: parameter {k} has shape {tuple(v.shape)}, "
                                      f"expected {tuple(total.shape)}")
            if v.is_floating_point():
                total += v.double()
        last = ckpt
    n = len(paths)
    averaged = {k: (v / n).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in summed.items()}
    averaged = {k: averaged[ties.get(k, k)] for k in first["model"]}  # in the model's order, tied names as one
    return {"config": last["config"], "model": averaged, "text": last.get("text"),
            "train_state": last.get("train_state", {}), "averaged_from": [str(p) for p in paths]}


class TwoRunsWarning(UserWarning):
    """`average_checkpoints` was given checkpoints of two runs (another seed, in another folder)."""


def _run_of(payload: dict[str, Any]) -> tuple[Any, str | None]:
    """(train.seed, run directory) of a checkpoint's run; both differ between two runs (a run continued with another
    seed keeps its folder, one copied elsewhere its seed). The folder in one spelling (runs/x, ./runs/x/); None where
    the config names neither it nor the config (the seed alone tells then)."""
    config = payload.get("config", {})
    train = config.get("train", {})
    folder = train.get("out_dir") or (f"runs/{config['name']}" if config.get("name") else None)
    return train.get("seed"), None if folder is None else os.path.normpath(str(folder))


def _ties_embeddings(payload: dict[str, Any]) -> bool:
    """Whether a checkpoint's config ties the embeddings (model.tie_embeddings)."""
    return bool(payload.get("config", {}).get("model", {}).get("tie_embeddings", False))


def average_into(paths: Sequence[str | Path], out: str | Path, overwrite: bool = False,
                 run: str | Path | None = None) -> Path:
    """Average checkpoints' parameters into the model file `out` (written atomically); returns the file written.

    `out` is NAME.safetensors, NAME, or the NAME.pt an older version wrote (NAME.safetensors in every case). An
    existing file is replaced only with `overwrite`, and never one of the inputs. `run` is the run directory the
    file belongs to, named in the line for a full disk.
    """
    if not paths:
        raise CheckpointError("give at least one checkpoint to average")
    if Path(out).is_dir() or str(out).endswith(("/", os.sep)):  # before NAME gets its .safetensors beside it
        raise ConfigError(f"--out {out} is a folder; give the path of the model file to write (e.g. "
                          f"{Path(out) / 'avg.safetensors'})")
    out = Path(out)
    if out.suffix == PAIR_SUFFIX:
        raise ConfigError(f"--out {out}: a model file is one .safetensors file, its config and vocabulary inside; "
                          f"name it {out.with_suffix(MODEL_SUFFIX)}")
    if out.suffix not in ("", ".pt", MODEL_SUFFIX):
        raise ConfigError(f"--out should be a .safetensors file, got {out}")
    target = _named(out.with_suffix("") if out.suffix == ".pt" else out)
    if target.is_dir():
        raise ConfigError(f"--out {target} is a folder; give the path of the model file to write")
    if any(same_file(model_file(p), target) for p in paths):
        raise ConfigError(f"--out {target} is one of the checkpoints to average: writing it would destroy what is "
                          "being read, even with --overwrite; choose another --out")
    refuse_to_replace(target, overwrite)
    averaged = average_checkpoints(paths)
    with writing(target, run=run):
        save_model_file(averaged, target)
    return target


def _same_text(a: Any, b: Any) -> bool:
    """Equality of two TextPipeline state dicts, tensors compared by value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_text(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_text(x, y) for x, y in zip(a, b))
    return a == b
