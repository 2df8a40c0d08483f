"""The copy task behind the training loader's interface: resumable epochs of `data_gen` batches, and a fixed
validation set."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from .batch import Batch
from .copy_task import data_gen


class CopyLoader:
    """The copy task behind the same interface as the Multi30k training loader.

    Every epoch's batches are a pure function of (seed, rank, epoch), so resuming mid-epoch only
    needs the number of batches already taken: they are generated again and skipped.
    """

    static_shapes = False  # not the static plan, though every batch has the same shape already

    def __init__(self, V: int, batch_size: int, nbatches: int, seq_len: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        self.V, self.batch_size, self.nbatches, self.seq_len = V, batch_size, nbatches, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self._taken = 0  # batches of this epoch already yielded
        self._skip = 0  # batches to skip at the next __iter__ (set by load_state_dict)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batches the next iteration yields."""
        self.epoch = epoch
        self._taken = self._skip = 0

    def __len__(self) -> int:
        return self.nbatches

    def __iter__(self) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 10_007 + self.epoch)
        self._taken = self._skip  # a resumed epoch has served these already
        for i, batch in enumerate(data_gen(self.V, self.batch_size, self.nbatches, self.seq_len, g)):
            if i < self._skip:
                continue
            self._taken = i + 1
            batch.global_ntokens = batch.ntokens * self.world_size  # every rank's batch has the same size, no padding
            yield batch
        self._skip = 0

    def lengths_served(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths of the sequences in batches start..stop-1 of this epoch, on all ranks."""
        rows = (stop - start) * self.batch_size * self.world_size
        return np.full(rows, self.seq_len), np.full(rows, self.seq_len)

    @property
    def taken(self) -> int:
        """Batches of the current epoch already yielded."""
        return self._taken

    def state_dict(self) -> dict[str, int]:
        """Where the current epoch stands."""
        return {"epoch": self.epoch, "taken": self._taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the saved epoch with its next unseen batch."""
        self.epoch = int(state["epoch"])
        self._skip = self._taken = int(state["taken"])


def copy_validation_batches(V: int, seq_len: int, seed: int, n: int = 400) -> list[Batch]:
    """A fixed validation set of `n` sequences, disjoint in seed from the training stream."""
    g = torch.Generator().manual_seed(seed + 7_777_777)
    return list(data_gen(V, n, 1, seq_len, g))
