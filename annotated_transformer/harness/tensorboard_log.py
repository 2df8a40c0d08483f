"""TensorBoard event files for a run (`train.tensorboard=true`): the figures of metrics.jsonl as scalars.

The `tensorboard` package is an optional extra (`uv sync --extra tensorboard`); it is imported only
when a run asks for event files, and asking without it is one clear error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runtime.errors import ConfigError

# metrics.jsonl record kind -> {field: TensorBoard tag}
TAGS: dict[str, dict[str, str]] = {
    "train": {"loss": "train/loss", "lr": "train/lr", "tokens_per_s": "train/tokens_per_s"},
    "epoch": {"train_loss": "epoch/train_loss", "val_loss": "epoch/val_loss", "bleu": "epoch/val_bleu",
              "train_seconds": "epoch/train_seconds",
              "gpu_util": "gpu/util_percent", "gpu_mem_used_gb": "gpu/mem_used_gb", "peak_mem_gb": "gpu/peak_mem_gb"},
    "step": {"train_loss": "step/train_loss", "val_loss": "step/val_loss", "bleu": "step/val_bleu"},  # val_every_steps
    "final": {"val_bleu": "final/val_bleu", "test_bleu": "final/test_bleu"},
}


def summary_writer_class() -> type:
    """torch's SummaryWriter; a ConfigError saying how to install it when the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.tensorboard=true needs the tensorboard package: install the extra with "
                          "`uv sync --extra tensorboard` (or `pip install tensorboard`), or set "
                          "train.tensorboard=false") from None
    return SummaryWriter


class TensorBoardLog:
    """Writes the numbers of each metrics record as scalars at the record's optimizer step."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.writer = summary_writer_class()(log_dir=str(self.folder))

    def add(self, record: dict[str, Any]) -> None:
        """Add the scalars of one metrics.jsonl record (beam-search BLEU of the final record included)."""
        tags = dict(TAGS.get(record.get("kind", ""), {}))
        if record.get("kind") == "final":
            tags.update({k: f"final/{k}" for k in record if "_bleu_beam" in k})
        for field, tag in tags.items():
            value = record.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, global_step=int(record.get("step", 0)))

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
