"""The run directory: everything a training run leaves behind, written by rank 0 only.

    runs/<name>/
      config.yaml          the resolved config (after overrides)
      vocab/               the TextPipeline: vocabularies, SentencePiece model, settings
      metrics.jsonl        one JSON object per log line and per epoch
      charts/              loss, learning rate and BLEU curves (.html with inlined JavaScript, .png)
      tensorboard/         the same figures as TensorBoard event files (train.tensorboard=true)
      epoch_NN.pt          model weights after epoch NN (for averaging)
      best.pt              the weights that scored best on validation
      last.pt              everything needed to resume (optimizer, scheduler, data position, RNG)
      avg.pt               the average of the last train.average_last epochs' weights (when set)
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ..config import Config
from ..config_loading import config_to_dict, config_yaml, upgrade_config_dict
from ..errors import ConfigError, RunDirError
from ..files import atomic_write, writing
from .checkpointing import load_checkpoint

# What a run writes before its first checkpoint: a folder holding only these may start again.
STARTED_FILES = {"config.yaml", "vocab", "metrics.jsonl", "charts", "tensorboard"}


# Data settings that say where files are or how they are read, not what the model learns from.
NOT_SETTINGS = {"data": {"root", "cache_dir", "num_workers"}}


def check_same_settings(saved: dict[str, Any], cfg: Config, path: Path) -> None:
    """A run can only be continued with the model and data settings that wrote its last.pt.

    Where the data lives (`data.root`, `data.cache_dir`) and how many workers read it may change.
    """
    now, saved = config_to_dict(cfg), upgrade_config_dict(saved)  # older names read as the current ones
    for section in ("model", "data"):
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
            "target_seconds": first.get("train_seconds") if first else None}


class RunDir:
    """Paths and writers of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

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
        return self.path / "best.pt"

    @property
    def avg(self) -> Path:
        return self.path / "avg.pt"

    def epoch(self, epoch: int) -> Path:
        """The weights saved after `epoch` (1-based)."""
        return self.path / f"epoch_{epoch:02d}.pt"

    def epoch_files(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every epoch_NN.pt, oldest first (by number: epoch_100 comes after epoch_99)."""
        found = []
        for path in self.path.glob("epoch_*.pt"):
            number = path.stem.removeprefix("epoch_")
            if number.isdigit():
                found.append((int(number), path))
        return sorted(found)

    def prune_epochs(self, keep_after: int) -> None:
        """Delete epoch_NN.pt files of epochs up to `keep_after` (train.keep_last_epochs)."""
        for epoch, path in self.epoch_files():
            if epoch <= keep_after:
                path.unlink(missing_ok=True)

    def has_run(self) -> bool:
        """True when the folder holds a previous run's files."""
        return self.path.is_dir() and any(self.path.iterdir())

    def plan(self, cfg: Config) -> tuple[str, dict[str, Any] | None]:
        """What to do with this folder: ('start', None), ('resume', last.pt) or ('finished', last.pt).

        `train.resume=auto` continues a run whose last.pt has the same model and data settings and
        leaves a finished one as it is; `true` insists on last.pt; `false` refuses any earlier run;
        `train.overwrite=true` replaces it. A folder that holds only what a run writes before its
        first checkpoint (it died in its first epoch) starts again. Anything else raises one line.
        """
        t = cfg.train
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"train.out_dir {self.path} is a file, not a folder; choose another train.out_dir")
        if t.resume is True and not self.last.is_file():
            raise ConfigError(f"train.resume=true but {self.last} does not exist; start a new run without "
                              "train.resume")
        if t.overwrite or not self.has_run():
            return "start", None
        if t.resume is False:
            raise ConfigError(f"run directory {self.path} already holds a run; continue it with train.resume=auto, "
                              "replace it with train.overwrite=true, or choose another train.out_dir")
        if not self.last.is_file():
            if {p.name for p in self.path.iterdir()} <= STARTED_FILES:
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

    def prepare(self, cfg: Config, plan: str) -> None:
        """Create the folder (emptied for a fresh start) and write the resolved config."""
        with writing(self.path, "create the run directory"):
            if plan == "start" and self.has_run():  # train.overwrite, or a run that died before its first checkpoint
                shutil.rmtree(self.path)
            self.path.mkdir(parents=True, exist_ok=True)
        with writing(self.config):
            atomic_write(self.config, lambda f: f.write(config_yaml(cfg).encode("utf-8")))

    def save_text(self, text: Any) -> None:
        """The run's TextPipeline (vocabularies, SentencePiece model) in vocab/, what translating reads."""
        with writing(self.vocab):
            text.save(self.vocab)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line (with a wall-clock time stamp) to metrics.jsonl."""
        record = {**record, "time": round(time.time(), 3)}
        with writing(self.metrics), self.metrics.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def records(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl (empty when missing), as `read_metrics` reads them."""
        return read_metrics(self.metrics) if self.metrics.is_file() else []

    def truncate_metrics(self, step: int) -> None:
        """Drop records logged after optimizer step `step` (a resumed run logs them again)."""
        kept = [r for r in self.records() if int(r.get("step", 0)) <= step]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        with writing(self.metrics):
            atomic_write(self.metrics, lambda f: f.write(text.encode("utf-8")))
