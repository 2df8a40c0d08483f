"""The notebook's data path, kept as a baseline for benchmarks.

The notebook fed the DataLoader raw sentence pairs, in batches of 32, and its collate function
tokenised every sentence with spaCy, looked the tokens up and padded each batch to 72 tokens,
again in every epoch. `notebook_dataloader` does exactly that with this project's vocabulary;
`data.batching=notebook` gives the same batches from the pre-numericalised cache instead.

The notebook padded with `F.pad(ids, (0, 72 - len(ids)))`; for a sentence longer than 72 ids
the negative width cuts it to its first 72 ids (dropping </s>). `pad_rows` does the same. No
Multi30k sentence is that long (the longest has 46 ids), so in practice nothing is cut.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial

import torch
from torch.utils.data import DataLoader

from .batch import Batch
from .buckets import NOTEBOOK_BATCH_SIZE, NOTEBOOK_PADDING, epoch_rng, pad_rows, notebook_batches
from .text import TextPipeline
from .vocab import BOS, EOS, PAD

Pair = tuple[str, str]


def notebook_collate(pairs: Sequence[Pair], text: TextPipeline, max_padding: int = NOTEBOOK_PADDING) -> Batch:
    """Tokenise raw (source, target) pairs one by one, numericalise, pad/cut to `max_padding`: a Batch."""
    src = [[BOS, *text.src_vocab.lookup_indices(text.tokenize(s, "src")), EOS] for s, _ in pairs]
    tgt = [[BOS, *text.tgt_vocab.lookup_indices(text.tokenize(t, "tgt")), EOS] for _, t in pairs]
    return Batch(pad_rows(src, PAD, max_padding), pad_rows(tgt, PAD, max_padding), pad=PAD)


def notebook_raw_batches(pairs: Sequence[Pair], seed: int = 0, epoch: int = 0,
                          batch_size: int = NOTEBOOK_BATCH_SIZE, shuffle: bool = True) -> Iterator[list[Pair]]:
    """Raw sentence pairs in batches of `batch_size`, in the same order as `data.batching=notebook`."""
    for b in notebook_batches(len(pairs), epoch_rng(seed, epoch) if shuffle else None, batch_size):
        yield [pairs[i] for i in b.tolist()]


def notebook_dataloader(pairs: Sequence[Pair], text: TextPipeline, batch_size: int = NOTEBOOK_BATCH_SIZE,
                         max_padding: int = NOTEBOOK_PADDING, shuffle: bool = True, seed: int = 0,
                         num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """The notebook's loader: a torch DataLoader over raw pairs whose collate tokenises every batch."""
    return DataLoader(list(pairs), batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(seed) if shuffle else None,
                      collate_fn=partial(notebook_collate, text=text, max_padding=max_padding),
                      num_workers=num_workers, pin_memory=pin_memory)
