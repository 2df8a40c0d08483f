"""Checkpoints: atomic writes, safe loads, and parameter averaging, in two formats.

The model files a user ships (best, avg and epoch_NN: weights, no training state) are a pair that
loads without unpickling anything:

    NAME.safetensors  the unique tensors of the model's state_dict, at their own dtype; a tied matrix
                      (tied embeddings: source, target and generator) is stored once, and the file's
                      metadata names the tied entries ({"tied": {alias: stored name}}) and every name in
                      the state_dict's order ("order"), so that loading gives every name back in that
                      order, tied names as one tensor
    NAME.json         {"format", "sha256" (of NAME.safetensors), "config" (the resolved config),
                      "text" (the TextPipeline's state_dict, its SentencePiece model in base64; null for
                      the copy task), "train_state"}, and "averaged_from" for an average

last.pt (what resuming needs) is a dict that `torch.load(weights_only=True)` reads (tensors, numbers,
strings, lists, dicts): nothing in it needs arbitrary unpickling, and a file that does is refused.
Files of that kind written before the model files existed (best.pt, avg.pt, epoch_NN.pt) load too.
Keys:

    format       "annotated-transformer/1"
    config       the resolved config (nested dict)
    model        the model's state_dict (unwrapped from DDP / torch.compile); with ema.decay on, the model
                 files hold the weight average, last.pt the raw weights
    ema          last.pt only, with ema.decay on: the weight average (extensions/ema.py)
    text         the TextPipeline's state_dict (vocabulary, tokenizer settings), or None (copy task)
    train_state  TrainState.state_dict()
    optimizer, scheduler, loader, rng    only in resumable checkpoints (last.pt)

`load_checkpoint` reads either format into that dict.
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
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from ..config import MODEL_EXTENSIONS, Config, apply_dict
from ..runtime.errors import CheckpointError, ConfigError, excerpt
from ..runtime.files import atomic_write, run_dir_error, writing
from ..loop import unwrap_model

CHECKPOINT_FORMAT = "annotated-transformer/1"
WEIGHTS_FORMAT = "annotated-transformer/weights/1"  # a model file pair: NAME.safetensors + NAME.json
WEIGHTS_SUFFIX = ".safetensors"
SETTINGS_SUFFIX = ".json"


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


def weights_pair(path: str | Path) -> tuple[Path, Path]:
    """The two files of a model file (NAME.safetensors, NAME.json) that `path` (either of them, or NAME) names."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (WEIGHTS_SUFFIX, SETTINGS_SUFFIX) else path
    return stem.with_name(stem.name + WEIGHTS_SUFFIX), stem.with_name(stem.name + SETTINGS_SUFFIX)


def is_model_file(path: str | Path) -> bool:
    """Whether `path` names a model file pair (by its suffix), rather than a torch checkpoint (.pt)."""
    return Path(path).suffix in (WEIGHTS_SUFFIX, SETTINGS_SUFFIX)


def checkpoint_file(path: str | Path) -> Path:
    """The file `path` names: itself, or for an older name that is gone (runs/x/best.pt), the model file
    that took its place (runs/x/best.safetensors); the JSON of a pair names its .safetensors."""
    path = Path(path)
    if is_model_file(path):
        return weights_pair(path)[0]
    if path.suffix == ".pt" and not path.exists() and weights_pair(path.with_suffix(""))[0].is_file():
        return weights_pair(path.with_suffix(""))[0]
    return path


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


# What a payload's JSON does not take from it: the tensors, and what each save works out anew.
_NOT_SETTINGS = ("format", "model", "text", "sha256")


def save_weights(payload: dict[str, Any], path: str | Path) -> tuple[Path, Path]:
    """Write a weights payload (config, model, text, train_state) as a model file pair; returns its two paths.

    Each file is written atomically, the .safetensors first: the JSON's SHA-256 of it is what loading
    checks, so a pair that a crash left half new is refused rather than mixed.
    """
    weights, settings = weights_pair(path)
    state = payload["model"]
    ties = tied_names(state)
    tensors = {name: _own_memory(t) for name, t in state.items() if name not in ties}
    # The names in the state_dict's order: safetensors hands its tensors back in no fixed order.
    metadata = {"format": WEIGHTS_FORMAT, "tied": json.dumps(ties), "order": json.dumps(list(state))}
    data = safetensors.torch.save(tensors, metadata)
    doc = {"format": WEIGHTS_FORMAT, "sha256": hashlib.sha256(data).hexdigest(),
           **{k: v for k, v in payload.items() if k not in _NOT_SETTINGS},
           "text": _text_to_json(payload.get("text"))}
    text = (json.dumps(doc, ensure_ascii=False, indent=1) + "\n").encode("utf-8")
    atomic_write(weights, lambda f: f.write(data))
    atomic_write(settings, lambda f: f.write(text))
    return weights, settings


def _own_memory(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU with memory of its own: safetensors refuses tensors that share memory (views of one)."""
    t = tensor.detach().to("cpu").contiguous()
    whole = t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def write_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Write `payload` in the format `path` names: a model file pair (.safetensors/.json), else a .pt file."""
    if is_model_file(path):
        save_weights(payload, path)
    else:
        save_checkpoint(payload, path)


def copy_checkpoint(source: str | Path, target: str | Path) -> None:
    """Copy a checkpoint written by `write_checkpoint` (both files of a model file pair), each atomically."""
    pairs = zip(weights_pair(source), weights_pair(target)) if is_model_file(source) else [(source, target)]
    for src_path, dst_path in pairs:
        with open(src_path, "rb") as src:
            atomic_write(dst_path, lambda f: shutil.copyfileobj(src, f, 16 << 20))


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

    def save(self, *jobs: tuple[dict[str, Any], Sequence[str | Path]]) -> None:
        """Queue each (payload, paths) job: the payload is written to every path in `paths`."""
        self.wait()
        memo: dict[Any, torch.Tensor] = {}
        snapshots = [(_cpu_copy(payload, memo), tuple(paths)) for payload, paths in jobs]
        self._thread = threading.Thread(target=self._run, args=(snapshots,), name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        """Block until queued writes are done; re-raise the error of one that failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self, snapshots: list[tuple[dict[str, Any], tuple[str | Path, ...]]]) -> None:
        target: str | Path = ""
        try:
            for snapshot, (first, *rest) in snapshots:
                # torch.save straight into the file: serialising into an in-memory buffer instead held
                # the GIL throughout and slowed the training thread's Python ten-fold meanwhile (measured).
                target = first
                write_checkpoint(snapshot, first)
                for target in rest:
                    copy_checkpoint(first, target)
        except OSError as exc:
            self._error = run_dir_error(exc, target, run=self.run)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = exc


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a model file pair or a .pt checkpoint (`weights_only=True`) as a checkpoint dict; every failure
    is one clear CheckpointError."""
    path = checkpoint_file(path)
    if is_model_file(path):
        return load_weights(path, map_location)
    if not path.is_file():
        hint = " (it is a directory; name a .safetensors or .pt file in it)" if path.is_dir() else ""
        raise CheckpointError(f"checkpoint {path} not found{hint}")
    kind = not_a_checkpoint(path)
    if kind is not None:
        run = path.parent  # the file's own run directory, when it is one, is what to pass instead
        where = (f"the run directory {run} or one of its checkpoint files" if (run / "metrics.jsonl").is_file()
                 else "a run directory or a checkpoint file written by training")
        raise CheckpointError(f"{path} is {kind}, not a checkpoint: pass {where}")
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


def load_weights(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A model file pair (`save_weights`) as a checkpoint dict, tied names sharing one tensor again.

    Nothing is unpickled: the tensors come from safetensors, the rest from JSON. A missing, damaged,
    truncated or mismatched file is one CheckpointError naming it.
    """
    weights, settings = weights_pair(path)
    if not weights.is_file() and settings.is_file():
        if not _is_settings(settings):  # a JSON file of another kind (a vocabulary, a config)
            raise CheckpointError(f"{settings} is a JSON file, not a model file: pass a run directory or a checkpoint "
                                  "file written by training")
        raise CheckpointError(f"{weights} is missing: {settings.name} is the other half of a model file, which needs "
                              f"the .safetensors written beside it; copy both files")
    if not weights.is_file():
        raise CheckpointError(f"checkpoint {weights} not found")
    if not settings.is_file():
        raise CheckpointError(f"{settings} is missing: {weights.name} needs the JSON written beside it (the model's "
                              f"config and vocabulary); copy both files")
    try:
        doc = json.loads(settings.read_text(encoding="utf-8"))
        data = weights.read_bytes()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{settings} is unreadable ({excerpt(exc)})") from None
    if not isinstance(doc, dict) or doc.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{settings} is not an annotated-transformer model file (no '{WEIGHTS_FORMAT}' "
                              "format tag)")
    damaged = (f"{weights} is damaged or truncated ({{}}); copy it again, or use another checkpoint of the run "
               f"(an epoch file, last.pt)")
    try:
        tensors = safetensors.torch.load(data)
        metadata = json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
        ties = json.loads(metadata.get("tied", "{}"))
        order = json.loads(metadata.get("order", "[]"))
    except (safetensors.SafetensorError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(damaged.format(excerpt(exc))) from None
    if hashlib.sha256(data).hexdigest() != doc.get("sha256"):
        raise CheckpointError(damaged.format(f"its SHA-256 is not the one {settings.name} records, so either file "
                                             "changed since they were written together"))
    state = {name: t.to(map_location) for name, t in sorted(tensors.items())}
    missing = sorted(set(ties.values()) - set(state))
    if missing:
        raise CheckpointError(damaged.format(f"the tied name {missing[0]} has no tensor"))
    state.update({alias: state[name] for alias, name in ties.items()})
    if sorted(order) == sorted(state):
        state = {name: state[name] for name in order}
    try:
        text = _text_from_json(doc.get("text"))
    except ValueError as exc:  # binascii.Error: not base64
        raise CheckpointError(f"{settings} holds a damaged SentencePiece model ({excerpt(exc)})") from None
    settings_only = {k: v for k, v in doc.items() if k not in _NOT_SETTINGS}
    return {**settings_only, "format": WEIGHTS_FORMAT, "model": state, "text": text}


def _is_settings(path: Path) -> bool:
    """Whether `path` is the JSON of a model file (its format tag), read as little as a look needs."""
    try:
        with open(path, "rb") as f:
            head = f.read(200)
    except OSError:
        return False
    return f'"format": "{WEIGHTS_FORMAT}"'.encode() in head


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
    first = load_checkpoint(paths[0])
    ref_model_cfg = _architecture(first["config"])
    ref_text = first.get("text")
    # Tied names share a tensor in model files; an older .pt file held copies, found by value then.
    ties = tied_names(first["model"]) or (_equal_matrices(first["model"]) if _ties_embeddings(first) else {})
    summed = {k: v.clone().double() if v.is_floating_point() else v.clone()
              for k, v in first["model"].items() if k not in ties}
    last = first
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
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


def _ties_embeddings(payload: dict[str, Any]) -> bool:
    """Whether a checkpoint's config ties the embeddings (model.tie_embeddings)."""
    return bool(payload.get("config", {}).get("model", {}).get("tie_embeddings", False))


def average_checkpoints_into(paths: Sequence[str], output: str) -> int:
    """The average command: average checkpoints' parameters into the model file `output` (written atomically).

    `output` may end in .safetensors or .json (either names the pair), or .pt, the name an older version
    wrote, or have no suffix: the pair is NAME.safetensors + NAME.json in every case.
    """
    if not paths:
        raise CheckpointError("give at least one checkpoint to average")
    out = Path(output)
    if out.suffix not in ("", ".pt", WEIGHTS_SUFFIX, SETTINGS_SUFFIX):
        raise ConfigError(f"--out should be a .safetensors file (its .json is written beside it), got {output}")
    weights, settings = weights_pair(out.with_suffix("") if out.suffix == ".pt" else out)
    averaged = average_checkpoints(paths)
    with writing(weights):
        save_weights(averaged, weights)
    print(f"averaged {len(paths)} checkpoints into {weights} (config and vocabulary in {settings.name})")
    return 0


def _same_text(a: Any, b: Any) -> bool:
    """Equality of two TextPipeline state dicts, tensors compared by value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_text(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_text(x, y) for x, y in zip(a, b))
    return a == b
