"""Parallel text, ready to train on: Multi30k (either direction) or your own files -> tokenised,
numericalised, cached splits -> loaders.

    data = load_translation_data(cfg)                       # first time: builds the cache (seconds)
    loader = data.train_loader(seed=42, rank=0, world_size=1)
    for epoch in range(n):
        loader.set_epoch(epoch)
        for batch in loader: ...                            # Batch objects with masks
    val = data.eval_batches("val")

Under torch.distributed, rank 0 downloads, verifies and builds the cache while the other ranks
wait for it; then every rank loads the same cache. The vocabulary comes from the training split
only (the notebook also counted validation and test words). `data.dataset` picks the corpus:
`multi30k` (multi30k.py) or `files`, your own (own_files.py); both read the same way from here on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from ..sections import CoreConfig, DataConfig
from ..runtime.errors import ConfigError, DataError
from .batch import Batch
from .buckets import (
    NOTEBOOK_PADDING,
    PadCollate,
    ShapedPadCollate,
    ShapedPairs,
    bucket_batches,
    epoch_rng,
    padding_fraction,
    notebook_batches,
    shaped_padding_fraction,
    static_batches,
)
from .cache import CacheUnreadable, corpus_settings, discard_cache, find_cache_folder, read_cache
from .ids import RaggedIds
from .loader import Resegment, TrainLoader, static_shapes_on
from .multi30k import MULTI30K_FILES, Multi30k, resolve_multi30k_dir, split_files
from .own_files import OwnFiles, picked_lines
from .text import TextPipeline
from .tokenise import build_cache

# What both corpora offer: splits, name, location, fingerprint(), count(split), read(split) -> (source lines,
# target lines) whole, chunks(split, side) -> the lines of one side a chunk at a time.
Corpus = Multi30k | OwnFiles
DATASETS = ("multi30k", "files")  # the values of data.dataset that are translation data


class TextLines(Sequence[str]):
    """One side of a split's raw lines, streamed from the corpus's file each time they are iterated (a chunk at a
    time, only the rows `keep` names) and never held: the training split's millions of sentences cost no memory.

    Iterating reads the file once; indexing and slicing read it up to the line asked for, which suits a few
    examples, not a loop (iterate instead, or copy to a list). Equal to a list of the same lines.
    """

    def __init__(self, corpus: Corpus, split: str, side: str, keep: np.ndarray | None = None) -> None:
        self.corpus, self.split, self.side = corpus, split, side
        self.lines = corpus.count(split)  # the file's, before `keep`
        self.keep = None if keep is None or keep.size == self.lines else keep

    def __len__(self) -> int:
        return self.lines if self.keep is None else int(self.keep.size)

    def __iter__(self) -> Iterator[str]:
        chunks = self._checked(self.corpus.chunks(self.split, self.side))
        if self.keep is None:
            return (line for lines in chunks for line in lines)
        return picked_lines(chunks, self.keep)

    def _checked(self, chunks: Iterator[list[str]]) -> Iterator[list[str]]:
        """The file's chunks, its line count compared with the one its data cache was built from at the end."""
        seen = 0
        for lines in chunks:
            seen += len(lines)
            yield lines
        if seen != self.lines:
            raise DataError(f"the {self.split} files in {self.corpus.location} have {seen} lines, their data cache "
                            f"{self.lines}: they changed since this run started; run again")

    def __getitem__(self, i: int | slice) -> Any:  # str, or list[str] for a slice
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step < 0:
                return list(self)[i]
            return list(islice(self, start, stop, step))
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"line {i} of {n}")
        return next(islice(self, i % n, None))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the list it stands for

    def __repr__(self) -> str:
        return f"TextLines({self.split}.{self.side}, {len(self)} lines of {self.corpus.location})"


@dataclass(eq=False)  # compared by identity: element-wise == on ids is meaningless
class Split:
    """One split: raw lines and their ids (<s> ... </s>), aligned; lines skipped by long_policy=skip are absent.

    The ids are RaggedIds, memory-mapped from the data cache. The raw lines are lists for val and test (small)
    and TextLines for the training split: read from the corpus's files when a consumer iterates them (subword
    sampling, a few examples), never held, so a large corpus is not millions of strings in memory.
    """

    name: str
    src_text: Sequence[str]
    tgt_text: Sequence[str]
    src: RaggedIds
    tgt: RaggedIds
    tgt_refs: list[str] | None = None  # word mode: tgt_text as BLEU compares it (tokens joined by spaces)

    def __post_init__(self) -> None:
        # Lists of ids (tests, hand-made splits) are packed once into the RaggedIds every consumer reads.
        if not isinstance(self.src, RaggedIds):
            self.src = RaggedIds.from_rows(self.src)
        if not isinstance(self.tgt, RaggedIds):
            self.tgt = RaggedIds.from_rows(self.tgt)

    def __len__(self) -> int:
        return len(self.src)

    @cached_property
    def src_lens(self) -> np.ndarray:
        """Source lengths in tokens, <s> and </s> included."""
        return self.src.lengths

    @cached_property
    def tgt_lens(self) -> np.ndarray:
        """Target lengths in tokens, <s> and </s> included."""
        return self.tgt.lengths

    def pairs(self) -> list[tuple[str, str]]:
        """The raw (source, target) sentence pairs."""
        return list(zip(self.src_text, self.tgt_text))


@dataclass(eq=False)
class TranslationData:
    """The text pipeline, the three splits, and statistics about them; makes the loaders."""

    text: TextPipeline
    splits: dict[str, Split]
    stats: dict[str, Any]
    config: DataConfig = field(default_factory=DataConfig)

    def train_loader(self, seed: int, rank: int = 0, world_size: int = 1, pin_memory: bool = False,
                     resegment: Resegment | None = None, plan_on_served: bool = False,
                     static: bool | None = None) -> TrainLoader:
        """This rank's resumable training batches (data.batching plan, data.batch_tokens budget); `resegment`
        (epoch -> ids of every training pair) replaces the cached ids each epoch, and with `plan_on_served` the
        batches are filled by the lengths it serves. `pin_memory` is what the callers pass for a CUDA device,
        so it also turns data.static_shapes=auto on, unless `static` is decided already."""
        d, train = self.config, self.splits["train"]
        if static is None:
            static = static_shapes_on(d.static_shapes, cuda=pin_memory, lengths_vary=plan_on_served)
        return TrainLoader(train.src, train.tgt, batching=d.batching, batch_tokens=d.batch_tokens, seed=seed,
                           rank=rank, world_size=world_size, pin_memory=pin_memory, num_workers=d.num_workers,
                           pad=self.text.pad_id, resegment=resegment, plan_on_served=plan_on_served,
                           static_shapes=static)

    def eval_batches(self, split: str, rank: int = 0, world_size: int = 1, static: bool = False) -> list[Batch]:
        """Deterministic length-bucketed batches of this rank's share of `split` (each sentence on one rank).

        Always bucketed with data.batch_tokens, also under data.batching=notebook, and with `static`
        drawn from the few shapes of the static plan (buckets.py), as the training batches of a run
        with static shapes: evaluation batches change no result, only the speed.
        """
        if split not in self.splits:
            raise ValueError(f"split must be one of {sorted(self.splits)}, got {split!r}")
        sp = self.splits[split]
        # Deal sentences out in length order, so every rank gets a similar mix of lengths.
        order = np.lexsort((sp.tgt_lens, sp.src_lens, np.maximum(sp.src_lens, sp.tgt_lens)))
        mine = order[rank::world_size]
        if static:
            shaped = ShapedPadCollate(self.text.pad_id, self.text.bos_id)
            plan = static_batches(sp.src_lens[mine], sp.tgt_lens[mine], self.config.batch_tokens)
            return [shaped(ShapedPairs([(sp.src[i], sp.tgt[i]) for i in mine[b.ids]], b.rows, b.width)) for b in plan]
        collate = PadCollate(self.text.pad_id)
        batches = bucket_batches(sp.src_lens[mine], sp.tgt_lens[mine], self.config.batch_tokens)
        return [collate([(sp.src[i], sp.tgt[i]) for i in mine[b]]) for b in batches]


# --------------------------------------------------------------------------- loading the cache


def apply_long_policy(src: RaggedIds, tgt: RaggedIds, max_sentence_len: int, skip: bool
                      ) -> tuple[RaggedIds, RaggedIds, np.ndarray, int, int]:
    """(src, tgt, kept line numbers, truncated pairs, skipped pairs) for sentences longer than `max_sentence_len` ids.

    Truncation keeps the first max_sentence_len - 1 ids and the closing </s> of each long side (RaggedIds' limit:
    nothing is copied); skipping keeps the other pairs' rows. Decided on the lengths alone, for every pair at once.
    """
    long = (src.lengths > max_sentence_len) | (tgt.lengths > max_sentence_len)
    src, tgt = src.limited(max_sentence_len), tgt.limited(max_sentence_len)
    if skip and long.any():
        keep = np.flatnonzero(~long)
        return src.subset(keep), tgt.subset(keep), keep, 0, int(long.sum())
    return src, tgt, np.arange(len(src)), 0 if skip else int(long.sum()), 0


def open_corpus(d: DataConfig, log: Callable[[str], None] | None = None, split: str | None = None) -> Corpus:
    """The corpus data.dataset names: Multi30k (found, downloaded, verified) or your own files (found; read later).
    `split`: only that split's two files (scoring one split needs no training data: the vocabulary is in the model
    file)."""
    if d.dataset == "files":
        if split is None:
            return OwnFiles.from_config(d)
        if not getattr(d, split, None):
            raise DataError(f"there is no {split} split: the config names no data.{split} files")
        return OwnFiles.from_config(d, splits=(split,))
    if d.dataset != "multi30k":
        raise ConfigError(f"data.dataset is '{d.dataset}'; only {' and '.join(DATASETS)} have translation data")
    names = tuple(MULTI30K_FILES) if split is None else split_files(split)
    return Multi30k(resolve_multi30k_dir(d, log=log, names=names), d.src_lang, d.tgt_lang)


def read_one_split(d: DataConfig, split: str, log: Callable[[str], None] | None = None
                   ) -> tuple[list[str], list[str]]:
    """The source and target lines of one split, finding and checking only its two files."""
    return open_corpus(d, log, split=split).read(split)


def _load_cached(d: DataConfig, corpus: Corpus, log: Callable[[str], None] | None, seed: int | None = None
                 ) -> tuple[TranslationData, bool]:
    """Read the cache, building it first if needed; returns (data, whether it was built now). `seed` (train.seed)
    draws SentencePiece's sample of a training split larger than data.spm_sample."""
    settings = corpus_settings(d, corpus, seed)  # streams and checks every file: bad data writes nothing
    folder = find_cache_folder(d, settings)
    built = False
    try:
        cached = read_cache(folder)  # memory, permissions, the disk: one DataError line, the cache left as it is
    except CacheUnreadable as exc:  # proven damaged: only then is it replaced
        if log:
            log(f"the data cache {folder} is damaged ({exc.within(folder)}); rebuilding it")
        discard_cache(folder)
        cached = None
    if cached is None:
        build_cache(d, corpus, settings, log)
        built = True
        try:
            cached = read_cache(folder)
        except CacheUnreadable as exc:
            raise DataError(f"the cache just written to {folder} cannot be read back ({exc.within(folder)}); "
                            f"check the disk, or set data.cache_dir to another folder") from None
    text, cached_splits, build_stats = cached
    text.max_sentence_len = d.max_sentence_len  # the cache holds untruncated ids; the limit is this run's
    splits, truncated, skipped, empty = {}, {}, {}, {}
    for name in corpus.splits:
        c = cached_splits.get(name)
        pairs = corpus.count(name)  # the files' lines, counted when they were checked; the cache's were checked
        if c is None or len(c["src"]) != pairs:  # against its manifest as it was read
            raise DataError(f"cache {folder} does not match the data in {corpus.location} ({name} split); "
                            f"delete the cache folder and run again")
        # Skipping drops training pairs only: val and test keep every sentence (truncated for the
        # teacher-forced loss), so BLEU is always computed on the complete, standard test sets.
        # a side of <s></s> alone: an empty line, which trains the model to say something for nothing (kept)
        empty[name] = int(((c["src"].lengths <= 2) | (c["tgt"].lengths <= 2)).sum())
        src, tgt, keep, truncated[name], skipped[name] = apply_long_policy(
            c["src"], c["tgt"], d.max_sentence_len, skip=d.long_policy == "skip" and name == "train")
        if name == "train":  # millions of lines on a large corpus: read only when a consumer iterates them
            splits[name] = Split(name, TextLines(corpus, name, "src", keep), TextLines(corpus, name, "tgt", keep),
                                 src, tgt)
        else:
            src_text, tgt_text = corpus.read(name)
            splits[name] = Split(name, src_text, tgt_text, src, tgt, c.get("refs"))
    if not len(splits["train"]):
        raise DataError(f"data.max_sentence_len={d.max_sentence_len} with data.long_policy=skip leaves no training "
                        "pairs; raise data.max_sentence_len or use data.long_policy=truncate")
    stats = dict(build_stats, truncated=truncated, skipped=skipped, empty=empty, max_sentence_len=d.max_sentence_len,
                 long_policy=d.long_policy, cache=str(folder), cache_hit=not built,
                 fingerprint={"settings": settings, "location": corpus.location})  # as data_fingerprint's
    return TranslationData(text, splits, stats, d), built


def _batching_stats(data: TranslationData, seed: int, static: bool) -> dict[str, Any]:
    """Padding and batch counts of the first epoch on train (one rank), for the bucket and the notebook's plan, and
    for the static-shape plan when the loader takes it (`static`)."""
    d, train = data.config, data.splits["train"]
    bucket = bucket_batches(train.src_lens, train.tgt_lens, d.batch_tokens, epoch_rng(seed, 0))
    notebook = notebook_batches(len(train), epoch_rng(seed, 0))
    pf_bucket = padding_fraction(bucket, train.src_lens, train.tgt_lens)
    pf_notebook = padding_fraction(notebook, train.src_lens, train.tgt_lens, pad_to=NOTEBOOK_PADDING)
    stats = {
        "batching": d.batching, "batch_tokens": d.batch_tokens,
        "batches_per_epoch": len(bucket) if d.batching == "bucket" else len(notebook),
        "padding_fraction": pf_bucket if d.batching == "bucket" else pf_notebook,
        "padding_fraction_bucket": pf_bucket, "padding_fraction_notebook": pf_notebook,
        "batches_per_epoch_bucket": len(bucket), "batches_per_epoch_notebook": len(notebook),
    }
    if d.batching == "bucket" and static:
        shaped = static_batches(train.src_lens, train.tgt_lens, d.batch_tokens, epoch_rng(seed, 0))
        stats.update(batches_per_epoch=len(shaped), static_shapes=len({(b.rows, b.width) for b in shaped}),
                     padding_fraction=shaped_padding_fraction(shaped, train.src_lens, train.tgt_lens))
    return stats


def load_translation_data(cfg: CoreConfig, rank: int = 0, world_size: int = 1,
                          log: Callable[[str], None] | None = print, static: bool | None = None,
                          corpus: Corpus | None = None) -> TranslationData:
    """Find (Multi30k: download and verify) the data, tokenise and cache it once, return it ready for the loaders.

    `static`: whether the training loader will take the static-shape plan, for the statistics' batch counts (None:
    when data.static_shapes is true; under 'auto' the device decides, which the caller knows). `corpus`: the one
    `open_corpus` gives, already opened (a resume checked its files): what it checked is not read again.

    Under an initialised torch.distributed group, rank 0 does the downloading and building while
    the others wait; an error on rank 0 is raised on every rank (nobody waits forever). `rank` and
    `world_size` describe the caller; the loaders take their own.
    """
    t0 = time.perf_counter()
    d = cfg.data
    if d.dataset not in DATASETS:
        raise ConfigError(f"data.dataset is '{d.dataset}'; only {' and '.join(DATASETS)} have translation data")
    if Path(d.cache_dir).expanduser().exists() and not Path(d.cache_dir).expanduser().is_dir():
        raise DataError(f"data.cache_dir {d.cache_dir} is a file, not a folder; set data.cache_dir to a folder (one "
                        "that does not exist yet is made)")
    group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    builder = not group or dist.get_rank() == 0
    error: BaseException | None = None
    data = None
    if builder:
        try:
            corpus = open_corpus(d, log=log) if corpus is None else corpus
            data, built = _load_cached(d, corpus, log, cfg.train.seed)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after telling the other ranks
            error = exc
    if group:
        box: list[Any] = [None if error is None else str(error)]
        dist.broadcast_object_list(box, src=0)  # doubles as the barrier: the cache is complete now
        if box[0] is not None and error is None:
            raise DataError(f"rank 0 could not prepare the data: {box[0]}")
    if error is not None:
        raise error
    if data is None:  # a waiting rank: the cache is there unless cache_dir is not shared (multi-node)
        corpus = open_corpus(d, log=None) if corpus is None else corpus
        data, built = _load_cached(d, corpus, None, cfg.train.seed)
    data.stats.update(_batching_stats(data, cfg.train.seed, d.static_shapes is True if static is None else static))
    data.stats.update(
        splits={n: len(s) for n, s in data.splits.items()},
        vocab={"src": len(data.text.src_vocab), "tgt": len(data.text.tgt_vocab)},
        tokenizer=d.tokenizer, built=built, data_dir=corpus.location, seconds=round(time.perf_counter() - t0, 3),
        dataset=corpus.name, direction=f"{d.src_lang}->{d.tgt_lang}",
    )
    if log and builder:
        log(stats_summary(data.stats))
    return data


def stats_summary(stats: dict[str, Any]) -> str:
    """One human-readable paragraph of the statistics of `load_translation_data`."""
    s = stats
    pairs = ", ".join(f"{name} {n}" for name, n in s["splits"].items())
    parts = [
        f"{s['dataset']} {s['direction']}: {pairs} pairs",
        f"{s['tokenizer']} vocab src {s['vocab']['src']} / tgt {s['vocab']['tgt']}",
        f"{s['batching']} batching{f' in {k} static shapes' if (k := s.get('static_shapes')) else ''}: "
        f"{s['batches_per_epoch']} batches/epoch, padding {s['padding_fraction']:.1%}",
    ]
    long_ = [f"{n} {split} pairs {what}" for what in ("truncated", "skipped")
             for split, n in s[what].items() if n]
    if long_:
        parts.append("longer than data.max_sentence_len: " + ", ".join(long_))
    empty = [f"{n} {split}" for split, n in s.get("empty", {}).items() if n]
    if empty:
        parts.append("pairs with one or both sides empty (kept): " + ", ".join(empty))
    parts.append(f"{'built' if s['built'] else 'loaded from cache'} in {s['seconds']:.2f} s")
    return " | ".join(parts)


def data_fingerprint(d: DataConfig, corpus: Corpus | None = None, seed: int | None = None) -> dict[str, Any]:
    """What a run's ids depend on, to compare at a resume: the cache settings (every file's sha256, the
    languages, the tokenizer's settings and version, SentencePiece's sample when `seed`, train.seed, draws one)
    and where the files are.

    Reads and checks every file of the corpus (`corpus`, or the one `d` names, opened without a download log).
    """
    corpus = open_corpus(d) if corpus is None else corpus
    return {"settings": corpus_settings(d, corpus, seed), "location": corpus.location}
