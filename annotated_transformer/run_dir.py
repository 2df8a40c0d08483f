"""The run directory: everything a training run leaves behind, written by rank 0 only.

    runs/<name>/
      config.yaml          the resolved config (after overrides)
      vocab/               the TextPipeline: vocabularies, SentencePiece model, settings
      metrics.jsonl        one JSON object per log line and per epoch
      charts/              loss, learning rate and BLEU curves (.html with inlined JavaScript, .png)
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

from .config import Config, save_config
from .errors import ConfigError

CHECKPOINT_GLOBS = ("epoch_*.pt", "best.pt", "last.pt")


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

    def check(self, cfg: Config) -> None:
        """Refuse to clobber an earlier run unless resuming or overwriting; refuse to resume nothing."""
        if cfg.train.resume:
            if not self.last.is_file():
                raise ConfigError(f"train.resume=true but {self.last} does not exist; "
                                  "start a new run without train.resume")
        elif self.has_run() and not cfg.train.overwrite:
            raise ConfigError(f"run directory {self.path} already holds a run; resume it with "
                              "train.resume=true, replace it with train.overwrite=true, "
                              "or choose another train.out_dir")

    def prepare(self, cfg: Config) -> None:
        """Create (or, with train.overwrite, empty) the folder and write the resolved config."""
        self.check(cfg)
        if not cfg.train.resume and self.has_run():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.config)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """Append one JSON line (with a wall-clock time stamp) to metrics.jsonl."""
        record = {**record, "time": round(time.time(), 3)}
        with self.metrics.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl (empty when missing)."""
        if not self.metrics.is_file():
            return []
        return [json.loads(line) for line in self.metrics.read_text(encoding="utf-8").splitlines() if line.strip()]

    def truncate_metrics(self, step: int) -> None:
        """Drop records logged after optimizer step `step` (a resumed run logs them again)."""
        kept = [r for r in self.read_metrics() if int(r.get("step", 0)) <= step]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        tmp = self.metrics.with_suffix(".jsonl.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.metrics)
