"""`RaggedIds`: the ids of many sentences in one flat array with offsets, one sentence a view.

A split of a million sentences is two flat arrays here (the ids, memory-mapped from the data cache, and
the offsets where each sentence starts), not a million NumPy arrays: the training process holds the
offsets and the lengths, and the operating system pages in the ids a batch reads. fairseq's binarised
datasets keep their ids the same way.

    ids = RaggedIds(flat, offsets)           # sentence i is flat[offsets[i]:offsets[i + 1]]
    ids[i]                                   # int64 array: <s> ... </s>
    ids.lengths                              # every sentence's length, <s> and </s> included
    ids.limited(128)                         # the same sentences cut to 128 ids, the closing </s> kept
    ids.subset(keep)                         # only the sentences `keep` names, in its order
    ids[:100]                                # the first 100 sentences, a RaggedIds too (nothing copied)
    RaggedIds.from_chunks(parts)             # rows arriving in chunks (a list of id lists each), packed

Pickled (a DataLoader worker started by spawn or forkserver receives its dataset so), a RaggedIds whose
arrays are views of read-only memory-mapped files travels as the files' names and places: the worker maps
them itself instead of receiving a copy of every id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np

from .vocab import EOS


class RaggedIds(Sequence[np.ndarray]):
    """Sentences of ids stored back to back in `flat`; sentence i is flat[offsets[i]:offsets[i + 1]].

    `limit` cuts a longer sentence to its first limit - 1 ids and the closing </s> (data.max_sentence_len);
    `rows` chooses and orders the sentences served (a split without the pairs data.long_policy=skip drops).
    Neither copies the ids.
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, limit: int | None = None,
                 rows: np.ndarray | None = None) -> None:
        flat, offsets = np.asarray(flat), np.asarray(offsets, dtype=np.int64)
        if flat.ndim != 1 or offsets.ndim != 1 or offsets.size == 0:
            raise ValueError("RaggedIds needs a 1-D array of ids and a non-empty 1-D array of offsets")
        if limit is not None and limit < 3:
            raise ValueError(f"limit must be at least 3 (<s>, a token, </s>), got {limit}")
        self.flat, self.offsets, self.limit = flat, offsets, limit
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], limit: int | None = None) -> RaggedIds:
        """Pack a list of id sequences (tests, small data) into one flat int32 array."""
        return cls.from_chunks([rows], limit)

    @classmethod
    def from_chunks(cls, chunks: Iterable[Sequence[Sequence[int]]], limit: int | None = None) -> RaggedIds:
        """Pack id sequences that arrive in chunks into one flat int32 array; only one chunk's rows are Python
        objects at a time when `chunks` is a generator."""
        flats, lengths = [], []
        for rows in chunks:
            lengths.append(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)))
            flats.append(np.fromiter(chain.from_iterable(rows), dtype=np.int32, count=int(lengths[-1].sum())))
        offsets = np.zeros(sum(map(len, lengths)) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return cls(np.concatenate(flats) if flats else np.zeros(0, dtype=np.int32), offsets, limit)

    def __len__(self) -> int:
        return self.offsets.size - 1 if self.rows is None else self.rows.size

    def _ids(self, k: int) -> np.ndarray:
        """Sentence `k` of the stored order, as int64 (the embeddings' index type), cut to the limit."""
        start, stop = int(self.offsets[k]), int(self.offsets[k + 1])
        if self.limit is not None and stop - start > self.limit:
            out = np.empty(self.limit, dtype=np.int64)
            out[:-1] = self.flat[start:start + self.limit - 1]
            out[-1] = EOS
            return out
        return self.flat[start:stop].astype(np.int64)

    def __getitem__(self, i: int | slice) -> np.ndarray | RaggedIds:  # type: ignore[override]
        n = len(self)
        if isinstance(i, slice):  # a few sentences (the first val sentences of a benchmark): a view, as lists slice
            return self.subset(np.arange(n)[i])
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"RaggedIds takes a sentence index or a slice, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"sentence {i} of {n}")
        i = int(i) % n
        return self._ids(i if self.rows is None else int(self.rows[i]))

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    @property
    def stored_lengths(self) -> np.ndarray:
        """Every stored sentence's length before the limit and the choice of rows (int64)."""
        return np.diff(self.offsets)

    @property
    def lengths(self) -> np.ndarray:
        """The length of every sentence served (<s> and </s> included, after the limit), int64."""
        lengths = self.stored_lengths
        if self.limit is not None:
            lengths = np.minimum(lengths, self.limit)
        return lengths if self.rows is None else lengths[self.rows]

    def limited(self, limit: int | None) -> RaggedIds:
        """The same sentences, each cut to `limit` ids (None: uncut)."""
        return RaggedIds(self.flat, self.offsets, limit, self.rows)

    def subset(self, keep: np.ndarray) -> RaggedIds:
        """The served sentences `keep` names (indices into this sequence), in its order."""
        keep = np.asarray(keep, dtype=np.int64)
        return RaggedIds(self.flat, self.offsets, self.limit, keep if self.rows is None else self.rows[keep])

    def __reduce__(self) -> tuple:
        # Memory-mapped arrays go as their files' names and places, every other array by value (see the module
        # docstring): np.memmap itself pickles every id it maps.
        return _unpickle, (_by_file(self.flat), _by_file(self.offsets), self.limit, _by_file(self.rows))


class MappedArray(NamedTuple):
    """Where a 1-D array lies in a file: what a pickled RaggedIds carries instead of a memory-mapped array."""

    filename: str
    offset: int  # bytes from the start of the file
    dtype: str
    length: int

    def open(self) -> np.ndarray:
        """Map the array, read-only."""
        return np.memmap(self.filename, dtype=np.dtype(self.dtype), mode="r", offset=self.offset, shape=(self.length,))


def _by_file(a: np.ndarray | None) -> np.ndarray | MappedArray | None:
    """A `MappedArray` for a non-empty 1-D contiguous view of a read-only np.memmap (as np.load(mmap_mode="r")
    gives), else `a` itself."""
    if a is None or a.ndim != 1 or a.size == 0 or not a.flags.c_contiguous:
        return a
    root = a  # the memmap the file was opened as: its first byte is at `offset` in the file (slices keep that offset)
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or root.mode != "r" or root.filename is None:
        return a
    start = int(root.offset) + a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return MappedArray(str(root.filename), start, a.dtype.str, int(a.size))


def _unpickle(flat: np.ndarray | MappedArray, offsets: np.ndarray | MappedArray, limit: int | None,
              rows: np.ndarray | MappedArray | None) -> RaggedIds:
    """A RaggedIds from what `RaggedIds.__reduce__` pickled, mapping the arrays that were mapped."""
    flat, offsets, rows = (x.open() if isinstance(x, MappedArray) else x for x in (flat, offsets, rows))
    return RaggedIds(flat, offsets, limit, rows)


def lengths_of(sentences: Sequence[Sequence[int]]) -> np.ndarray:
    """Every sentence's length (int64): a RaggedIds' `lengths` (no pass over the sentences), else one len() each."""
    if isinstance(sentences, RaggedIds):
        return sentences.lengths
    return np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
