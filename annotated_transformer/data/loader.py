"""`TrainLoader`: the training batches of one rank, resumable mid-epoch.

A `StatefulDataLoader` (torchdata) draws index lists from `EpochBatchSampler` and pads them into
`Batch` objects with `PadCollate`. The sampler's plan is a pure function of (seed, epoch), so the
loader's state is just "epoch e, k batches taken": on resume the sampler recomputes the epoch's
plan and the data loader skips the k index lists it already served, without loading them.

With static shapes (data.static_shapes; buckets.py's `static_batches`) the sampler yields a
`ShapedBatch` (sentence indices, rows, width) instead of a list of indices, `ShapedPairDataset`
hands its pairs on with the shape, and `ShapedPadCollate` pads them to exactly that shape.

The sentences are any sequence of id arrays: a `RaggedIds` (ids.py) as the data cache gives them, whose
lengths the plan reads without a pass over the sentences and whose ids a batch reads from the memory-mapped
file, or a plain list of arrays (tests, the copy task). The plan is the same for both.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ..runtime.errors import DataError
from .batch import Batch
from .buckets import (
    NOTEBOOK_BATCH_SIZE,
    NOTEBOOK_PADDING,
    PadCollate,
    ShapedBatch,
    ShapedPadCollate,
    ShapedPairs,
    bucket_batches,
    bucket_starts,
    epoch_rng,
    notebook_batches,
    shard,
    static_batches,
    static_groups,
)
from .ids import lengths_of
from .vocab import PAD

BATCHING_MODES = ("bucket", "notebook")
STATIC_SHAPES = ("auto", True, False)  # the values of data.static_shapes

# epoch -> that epoch's (source ids, target ids) of every training sentence, aligned with the batch plan
Resegment = Callable[[int], tuple[Sequence[np.ndarray], Sequence[np.ndarray]]]


class PairDataset(Dataset):
    """Pre-numericalised (src, tgt) id arrays, indexed by sentence (a RaggedIds or a list of arrays a side).

    A DataLoader worker started by fork shares it with the training process; one started by spawn or
    forkserver receives it pickled, and a memory-mapped RaggedIds pickles as its files' names (ids.py).
    """

    def __init__(self, src: Sequence[np.ndarray], tgt: Sequence[np.ndarray]) -> None:
        self.src, self.tgt = src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def __getitems__(self, indices: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        # The DataLoader asks for a whole batch at once: one call instead of one per sentence.
        return [(self.src[i], self.tgt[i]) for i in indices]


class ShapedPairDataset(PairDataset):
    """PairDataset for static shapes: a batch's index is a `ShapedBatch`, and its pairs go on with its shape."""

    def __getitems__(self, batch: ShapedBatch) -> ShapedPairs:  # type: ignore[override]
        return ShapedPairs([(self.src[i], self.tgt[i]) for i in batch.ids.tolist()], batch.rows, batch.width)


def static_shapes_on(setting: bool | str, cuda: bool, lengths_vary: bool = False) -> bool:
    """Whether data.static_shapes (`setting`) turns the static-shape plan on for this run.

    'auto': on when training on a CUDA GPU (where one compiled or captured step per shape pays),
    off on the CPU (today's bucket plan, unchanged) and off when subword sampling draws new lengths
    every epoch (`lengths_vary`: batches would outgrow their planned widths).
    """
    if setting not in STATIC_SHAPES:
        raise ValueError(f"static_shapes must be one of {STATIC_SHAPES}, got {setting!r}")
    return (cuda and not lengths_vary) if setting == "auto" else bool(setting)


class EpochBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of sentence indices) of the epoch chosen with `set_epoch`."""

    def __init__(self, src_lens: np.ndarray, tgt_lens: np.ndarray, *, batching: str = "bucket",
                 batch_tokens: int = 4096, seed: int = 0, rank: int = 0, world_size: int = 1,
                 batch_size: int = NOTEBOOK_BATCH_SIZE, static: bool = False) -> None:
        if batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {batching!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.src_lens, self.tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
        self.batching, self.batch_tokens, self.batch_size = batching, batch_tokens, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        # Static shapes change the bucket plan only: the notebook's batches are fixed-size already.
        self.static = static and batching == "bucket"
        self.epoch = 0
        self.skip = 0  # batches of this epoch the next iteration passes over: what a resumed epoch served
        self._served: tuple[int, np.ndarray, np.ndarray] | None = None
        # The latest (epoch, global plan): an epoch's iteration, its global_tokens and lengths_served read one
        # plan, made once (at millions of sentences a plan is a sort of every sentence).
        self._plan: tuple[int, list[np.ndarray] | list[ShapedBatch]] | None = None
        # The number of global batches does not depend on the epoch (see bucket_batches): counted once, from the
        # lengths alone, it tells every rank the length of every epoch.
        self._num_global = self._count_global()

    @property
    def served(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """(epoch, source lengths, target lengths) that epoch serves, when the batches are filled by them."""
        return self._served

    @served.setter
    def served(self, value: tuple[int, np.ndarray, np.ndarray] | None) -> None:
        self._served, self._plan = value, None  # the plan of a served epoch follows its lengths

    def _count_global(self) -> int:
        """The number of global batches of every epoch, without planning one."""
        n = len(self.src_lens)
        if self.batching == "notebook":
            return -(-n // self.batch_size)
        if self.static:
            return sum(k for _, k, _, _ in static_groups(np.maximum(self.src_lens, self.tgt_lens),
                                                           self.batch_tokens))
        return len(bucket_starts(np.maximum(self.src_lens, self.tgt_lens), self.batch_tokens))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose plan the next iteration follows, from its first batch."""
        self.epoch = int(epoch)
        self.skip = 0

    def global_plan(self, epoch: int) -> list[np.ndarray] | list[ShapedBatch]:
        """Every rank's batches of `epoch`, before sharding (with static shapes: `ShapedBatch`es); read-only."""
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, self._make_plan(epoch))
        return self._plan[1]

    def _make_plan(self, epoch: int) -> list[np.ndarray] | list[ShapedBatch]:
        """`global_plan`, computed."""
        rng = epoch_rng(self.seed, epoch)
        if self.batching == "notebook":
            return notebook_batches(len(self.src_lens), rng, self.batch_size)
        served = self.served[1:] if self.served is not None and self.served[0] == epoch else None
        plan = static_batches if self.static else bucket_batches
        return plan(self.src_lens, self.tgt_lens, self.batch_tokens, rng, served)

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """Every rank's batches of `epoch` as sentence indices, before sharding."""
        plan = self.global_plan(epoch)
        return [b.ids for b in plan] if self.static else plan

    def batches(self, epoch: int) -> list[np.ndarray] | list[ShapedBatch]:
        """This rank's batches of `epoch`."""
        return shard(self.global_plan(epoch), self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[int] | ShapedBatch]:
        skip, self.skip = self.skip, 0  # the batches a resumed epoch served already (once)
        for b in self.batches(self.epoch)[skip:]:
            yield b if self.static else b.tolist()

    def __len__(self) -> int:
        return -(-self._num_global // self.world_size) if self._num_global else 0


class TrainLoader:
    """One rank's training batches: length-bucketed (static-shape, or the notebook's) plan, sharded, resumable.

    Usage per epoch: `set_epoch(e)`, then iterate; `state_dict()` at any point mid-epoch, and
    `load_state_dict(state)` in a new process continues with the next unseen batch.
    """

    def __init__(self, src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], *, batching: str = "bucket",
                 batch_tokens: int = 4096, seed: int = 0, rank: int = 0, world_size: int = 1,
                 pin_memory: bool = False, num_workers: int = 0, pad: int = PAD,
                 resegment: Resegment | None = None, plan_on_served: bool = False,
                 static_shapes: bool = False) -> None:
        self.sampler = EpochBatchSampler(
            lengths_of(src), lengths_of(tgt), batching=batching, batch_tokens=batch_tokens, seed=seed, rank=rank,
            world_size=world_size, static=static_shapes)
        width = NOTEBOOK_PADDING if batching == "notebook" else None
        self.width = width
        # epoch -> that epoch's (src, tgt) ids of every sentence (subword sampling); the batches' sizes keep the
        # lengths above
        self.resegment = resegment
        # Fill the batches in the order of the served lengths (subword sampling: fewer padded positions)
        self.plan_on_served = plan_on_served
        self.dataset = (ShapedPairDataset if self.sampler.static else PairDataset)(src, tgt)
        collate = ShapedPadCollate(pad) if self.sampler.static else PadCollate(pad, width)
        self.src_lens, self.tgt_lens = self.sampler.src_lens, self.sampler.tgt_lens  # of the ids served this epoch
        self.resegment_seconds = 0.0  # what the latest set_epoch spent resegmenting
        # Imported here, not at the top: only training needs torchdata, and `import annotated_transformer`
        # (translating, evaluating, the notebook) should not pay for it.
        from torchdata.stateful_dataloader import StatefulDataLoader

        with warnings.catch_warnings():
            # torchdata 0.11 calls torch.set_vital, which torch >= 2.9 flags as deprecated: not ours to fix.
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            self.loader = StatefulDataLoader(
                self.dataset, batch_sampler=self.sampler, collate_fn=collate,
                num_workers=num_workers, pin_memory=pin_memory,
                # Its own generator: a DataLoader draws a seed for every new iterator, and from the global
                # RNG that would shift the dropout stream of a run resumed mid-epoch (measured: the first
                # step after a resume differed from the uninterrupted run's).
                generator=torch.Generator().manual_seed(seed),
            )
        self.epoch = 0
        self._finished_epoch = False  # a loaded state said: this epoch has no batches left
        self._taken = 0  # batches of this epoch already served

    @property
    def static_shapes(self) -> bool:
        """Whether the batches come from the static-shape plan."""
        return self.sampler.static

    def shapes(self) -> list[tuple[int, int]]:
        """The static plan's (rows, width) batch shapes, narrowest first; every epoch has the same (empty: not
        static)."""
        if not self.static_shapes:
            return []
        widths = np.maximum(self.sampler.src_lens, self.sampler.tgt_lens)
        return [(rows, width) for width, _, rows, _ in static_groups(widths, self.sampler.batch_tokens)]

    @property
    def world_size(self) -> int:
        """Number of ranks the batches are shared between."""
        return self.sampler.world_size

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first batch; its order is a pure function of (seed, epoch)."""
        self.epoch = int(epoch)
        self.sampler.set_epoch(self.epoch)
        if self.resegment is not None:
            t0 = time.perf_counter()
            src, tgt = self.resegment(self.epoch)
            if not len(src) == len(tgt) == len(self.sampler.src_lens):
                raise DataError(f"the resegmented training data has {len(src)} source and {len(tgt)} target "
                                f"sentences, the batch plan {len(self.sampler.src_lens)}; they must stay aligned")
            self.dataset.src, self.dataset.tgt = src, tgt
            self.src_lens, self.tgt_lens = lengths_of(src), lengths_of(tgt)
            if self.plan_on_served:
                self.sampler.served = (self.epoch, self.src_lens, self.tgt_lens)
            self.resegment_seconds = time.perf_counter() - t0
        self.loader.load_state_dict({})  # forget any half-used iterator of the previous epoch
        self._finished_epoch = False
        self._taken = 0

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        if self._finished_epoch:  # resumed exactly at the end of an epoch: nothing left to serve
            self._finished_epoch = False
            return
        totals = self.global_tokens(self.epoch) if self.world_size > 1 else None
        self._taken = self.sampler.skip  # a new pass over the epoch starts at its first batch, or a resume's
        for batch in self.loader:
            if totals is not None:
                batch.global_ntokens = totals[self._taken]
            self._taken += 1
            yield batch

    def global_tokens(self, epoch: int) -> list[int]:
        """Non-padding target tokens at each position of this rank's epoch, summed over all ranks.

        Every rank computes the same global plan, so the loss divisor of a DDP step is known on the
        host of every rank without an all-reduce. A target row of n ids (<s> and </s> included,
        cut to the fixed width in notebook mode) gives n - 1 predicted tokens.
        """
        plan = self.sampler.global_batches(epoch)
        if not plan:
            return []
        lens = self.tgt_lens if self.width is None else np.minimum(self.tgt_lens, self.width)
        sizes = np.fromiter(map(len, plan), dtype=np.int64, count=len(plan))
        ends = np.cumsum(sizes)
        summed = np.concatenate(([0], np.cumsum(lens[np.concatenate(plan)])))  # running token count, plan order
        per_batch = summed[ends] - summed[ends - sizes] - sizes
        # rank r's k-th batch is global batch (r + k * world_size) mod len(plan) (see buckets.shard)
        taken = np.arange(len(self) * self.world_size) % len(plan)
        return per_batch[taken].reshape(len(self), self.world_size).sum(axis=1).tolist()

    def lengths_served(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target lengths (ids, <s> and </s> included, cut to the notebook's width) of the
        sentences in batches start..stop-1 of this epoch, on all ranks together (for counting compute)."""
        plan, ws = self.sampler.global_batches(self.epoch), self.world_size
        chosen = [plan[i % len(plan)] for i in range(start * ws, stop * ws)] if plan else []
        rows = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
        src, tgt = self.src_lens[rows], self.tgt_lens[rows]
        return (src, tgt) if self.width is None else (np.minimum(src, self.width), np.minimum(tgt, self.width))

    @property
    def taken(self) -> int:
        """Batches of the current epoch already served."""
        return self._taken

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands (plain Python values, safe for torch.load(weights_only=True))."""
        return {"epoch": self.epoch, "seed": self.sampler.seed, "world_size": self.world_size,
                "batches_per_epoch": len(self), "static_shapes": self.static_shapes, "taken": self._taken,
                "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch with its next unseen batch."""
        saved_static = bool(state.get("static_shapes", False))  # saved before static shapes existed: the bucket plan
        if saved_static != self.static_shapes:
            raise DataError(
                f"the saved data position is for static batch shapes {'on' if saved_static else 'off'}, this run "
                f"has them {'on' if self.static_shapes else 'off'} (data.static_shapes=auto: on for CUDA training "
                f"only); resume with data.static_shapes={str(saved_static).lower()}")
        if state.get("world_size") != self.world_size or state.get("batches_per_epoch") != len(self):
            raise DataError(
                f"the saved data position is for {state.get('world_size')} process(es) and "
                f"{state.get('batches_per_epoch')} batches per epoch, this run has {self.world_size} and {len(self)}; "
                "resume with the same number of processes and the same data settings")
        if state.get("seed", self.sampler.seed) != self.sampler.seed:
            raise DataError(f"the saved data position is for train.seed={state['seed']}, this run has "
                            f"{self.sampler.seed}; resume with the same seed")
        self.set_epoch(state["epoch"])
        if "taken" in state:
            # The plan is a pure function of (seed, epoch): pass over the batches served. The loader's own state
            # is not used, as its form depends on data.num_workers, which may change at a resume.
            self._taken = self.sampler.skip = int(state["taken"])
            self._finished_epoch = self._taken >= len(self)
            return
        inner = state["loader"]  # an older version's position, kept only in the loader's form
        if ("_snapshot" in inner) != (self.loader.num_workers > 0):
            raise DataError("the saved data position comes from an older version that kept it only in the loader's "
                            "own form; resume with the data.num_workers it was saved with")
        self.loader.load_state_dict(inner)
        # StatefulDataLoader restarts a finished epoch from scratch; a run stopped right after the
        # last batch must instead see an empty rest of the epoch.
        self._finished_epoch = bool(inner.get("_iterator_finished", False))
        self._taken = int(inner.get("_num_yielded", 0))
