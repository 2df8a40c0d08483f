"""Building the data cache: a corpus tokenised and numericalised a chunk of lines at a time.

No training file is ever whole in memory: the files are streamed (own_files.file_chunks, about
16 MB of text a chunk) and each chunk's ids are appended to the cache's flat files (cache.IdsWriter),
so memory follows the chunk, not the corpus.

    spm mode   SentencePiece learns from the training text of both languages: every sentence, or,
               when there are more than data.spm_sample, that many (a random sample of the pairs,
               drawn with train.seed, picked while streaming). Then every chunk of every split is
               encoded on all cores with SentencePiece's own threads (as fast as one worker process
               a core, without starting any: the ids do not depend on the number of threads).
    word mode  spaCy tokenises each training chunk once (one process: spaCy is the slow part): its
               tokens are counted and stored as provisional ids, numbered in order of first
               appearance; once the counts give the vocabulary, a second pass maps the stored ids to
               the vocabulary's (the same ids as tokenising everything at once). Val and test are
               small: tokenised whole, their references kept for BLEU.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.device import usable_cores
from ..runtime.errors import DataError
from .cache import CacheWriter, IdsWriter, cache_folder, ids_dtype
from .own_files import CHUNK_BYTES, picked_lines
from .text import SIDES, TextPipeline
from .tokenizers import spacy_tokenizer, word_tokenize_many
from .vocab import BOS, EOS, SPECIALS, Vocab

if TYPE_CHECKING:
    from ..sections import DataConfig
    from .multi30k import Multi30k
    from .own_files import OwnFiles

    Corpus = Multi30k | OwnFiles

PROGRESS_EVERY_S = 10.0  # a progress line this often while a long training split is tokenised
REMAP_IDS = 1 << 24  # word mode's second pass maps about this many stored ids at a time


class Progress:
    """'tokenising WHAT: N of TOTAL sentences', at most every PROGRESS_EVERY_S seconds (nothing for a quick split)."""

    def __init__(self, log: Callable[[str], None] | None, what: str, total: int) -> None:
        self.log, self.what, self.total = log, what, total
        self.done, self.last = 0, time.perf_counter()

    def add(self, sentences: int) -> None:
        """`sentences` more are tokenised."""
        self.done += sentences
        now = time.perf_counter()
        if self.log and now - self.last >= PROGRESS_EVERY_S:
            self.log(f"tokenising {self.what}: {self.done:,} of {self.total:,} sentences")
            self.last = now


def _all_lines(chunks: Iterable[list[str]]) -> Iterator[str]:
    return (line for lines in chunks for line in lines)


def _train_subwords(d: DataConfig, corpus: Corpus, sample: dict[str, int] | None, log: Callable[[str], None] | None,
                    chunk_bytes: int) -> tuple[TextPipeline, int]:
    """The SentencePiece model of the training split (or of its sample), and how many sentences it learnt from."""
    pairs = corpus.count("train")
    src, tgt = (corpus.chunks("train", side, chunk_bytes) for side in SIDES)
    if sample is None:
        sentences, src_lines, tgt_lines = 2 * pairs, _all_lines(src), _all_lines(tgt)
    else:
        rng = np.random.default_rng(sample["seed"])
        rows = np.sort(rng.choice(pairs, size=sample["sentences"] // 2, replace=False))
        sentences, src_lines, tgt_lines = 2 * rows.size, picked_lines(src, rows), picked_lines(tgt, rows)
        if log:
            log(f"SentencePiece trains on {sentences} of {2 * pairs} sentences (data.spm_sample)")
    if log:
        log(f"training a joint SentencePiece model ({d.spm_vocab_size} pieces) on the training split")
    text = TextPipeline.for_subwords(src_lines, tgt_lines, src_lang=d.src_lang, tgt_lang=d.tgt_lang,
                                     vocab_size=d.spm_vocab_size, lowercase=d.lowercase,
                                     max_sentence_len=d.max_sentence_len)
    return text, sentences


def _encode_split(text: TextPipeline, corpus: Corpus, split: str, cache: CacheWriter, dtype: np.dtype,
                  progress: Progress | None, chunk_bytes: int) -> dict[str, int]:
    """Spm mode: both sides of `split` encoded a chunk at a time into the cache; the longest sentence of each."""
    longest = {}
    threads = usable_cores()
    for side in SIDES:
        ids = cache.ids(split, side, dtype)
        for lines in corpus.chunks(split, side, chunk_bytes):
            ids.append(*text.ids_flat(lines, side, dtype, threads))
            if progress:
                progress.add(len(lines))
        ids.close()
        longest[side] = ids.longest
    return longest


class WordIds:
    """Word mode's first pass over one side of the training split: each chunk's spaCy tokens counted and stored as
    provisional ids (len(SPECIALS) + the order of a token's first appearance; <s> and </s> as themselves)."""

    def __init__(self, lang: str, lowercase: bool) -> None:
        self.lang, self.lowercase = lang, lowercase
        self.index: dict[str, int] = {}  # token -> provisional id
        self.counts = np.zeros(len(SPECIALS), dtype=np.int64)  # provisional id -> occurrences

    def chunk(self, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The provisional ids of `lines` (<s> ... </s> each) back to back, and each sentence's length."""
        index, first = self.index, len(SPECIALS)
        ids: list[int] = []
        lengths = np.empty(len(lines), dtype=np.int64)
        for i, tokens in enumerate(word_tokenize_many(lines, self.lang, self.lowercase)):
            ids.append(BOS)
            ids.extend([index.setdefault(t, len(index) + first) for t in tokens])
            ids.append(EOS)
            lengths[i] = len(tokens) + 2
        flat = np.array(ids, dtype=np.int32)
        seen = np.bincount(flat, minlength=len(index) + first)
        seen[: self.counts.size] += self.counts
        self.counts = seen
        return flat, lengths

    def token_counts(self) -> dict[str, int]:
        """Every token seen and its occurrences."""
        return {token: int(self.counts[i]) for token, i in self.index.items()}

    def final_ids(self, vocab: Vocab, dtype: np.dtype) -> np.ndarray:
        """provisional id -> the vocabulary's id (<unk> for a token it lacks; a special as itself)."""
        table = np.arange(len(SPECIALS) + len(self.index), dtype=np.int64)
        table[len(SPECIALS):] = [vocab[token] for token in self.index]
        return table.astype(dtype)


def _remap(scratch: Path, cache: CacheWriter, side: str, table: np.ndarray) -> int:
    """Word mode's second pass: the provisional ids stored in `scratch` mapped through `table` into the cache's
    training split; the longest sentence."""
    provisional = np.load(scratch / f"train.{side}.ids.npy", mmap_mode="r")
    offsets = np.load(scratch / f"train.{side}.offsets.npy", mmap_mode="r")
    ids = cache.ids("train", side, table.dtype)
    start, n = 0, offsets.size - 1
    while start < n:
        # As many sentences as fit in REMAP_IDS ids, and at least one.
        stop = max(start + 1, int(np.searchsorted(offsets, offsets[start] + REMAP_IDS, side="right")) - 1)
        stop = min(stop, n)
        ids.append(table[provisional[offsets[start]:offsets[stop]]], np.diff(offsets[start:stop + 1]))
        start = stop
    ids.close()
    return ids.longest


def _train_words(d: DataConfig, corpus: Corpus, cache: CacheWriter, progress: Progress,
                 chunk_bytes: int) -> tuple[TextPipeline, dict[str, int]]:
    """Word mode's training split: tokenised once, counted, stored provisionally, then numericalised."""
    scratch = cache.path / "scratch"  # removed before the manifest lists the cache's files
    scratch.mkdir()
    firsts = {}
    for side, lang in zip(SIDES, (d.src_lang, d.tgt_lang)):
        firsts[side] = WordIds(lang, d.lowercase)
        stored = IdsWriter(scratch, "train", side, np.dtype(np.int32))
        for lines in corpus.chunks("train", side, chunk_bytes):
            stored.append(*firsts[side].chunk(lines))
            progress.add(len(lines))
        stored.close()
    text = TextPipeline.for_word_counts(firsts["src"].token_counts(), firsts["tgt"].token_counts(),
                                        src_lang=d.src_lang, tgt_lang=d.tgt_lang, lowercase=d.lowercase,
                                        max_sentence_len=d.max_sentence_len, min_freq=d.min_freq)
    longest = {}
    for side in SIDES:
        vocab = text.vocab(side)
        longest[side] = _remap(scratch, cache, side, firsts[side].final_ids(vocab, ids_dtype(len(vocab))))
    shutil.rmtree(scratch)
    return text, longest


def _word_split(text: TextPipeline, corpus: Corpus, split: str, cache: CacheWriter) -> dict[str, int]:
    """Word mode's val or test split, whole: the ids, and the targets' tokens as BLEU's references."""
    src_lines, tgt_lines = corpus.read(split)
    tokens = text.tokenize_many(tgt_lines, "tgt")  # tokenised once: the ids, and the references
    rows = {"src": text.ids_many(src_lines, "src"), "tgt": [text.numericalize(t, "tgt") for t in tokens]}
    longest = {}
    for side in SIDES:
        ids = cache.ids(split, side, ids_dtype(len(text.vocab(side))))
        ids.append_rows(rows[side])
        ids.close()
        longest[side] = ids.longest
    cache.refs(split, [" ".join(t) for t in tokens])
    return longest


def build_cache(d: DataConfig, corpus: Corpus, settings: dict[str, Any], log: Callable[[str], None] | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> Path:
    """Tokenise and numericalise every split once, the vocabulary from train, into the cache folder of `settings`
    (`cache_settings` of this corpus; its spm_sample, drawn with train.seed, is SentencePiece's sample of a large
    training split). Every file is checked before anything is written."""
    t0 = time.perf_counter()
    if d.tokenizer == "word":  # a language spaCy lacks is one line now, not after tokenising the other side
        for lang in (d.src_lang, d.tgt_lang):
            spacy_tokenizer(lang)
    raw_lines = {split: corpus.count(split) for split in corpus.splits}
    folder = cache_folder(d, settings)
    stats: dict[str, Any] = {"raw_lines": raw_lines}
    try:
        with CacheWriter(folder) as cache:
            t_tok = time.perf_counter()
            longest = {}
            if d.tokenizer == "word":
                progress = Progress(log, "the training split", 2 * raw_lines["train"])
                text, longest["train"] = _train_words(d, corpus, cache, progress, chunk_bytes)
                for split in corpus.splits[1:]:
                    longest[split] = _word_split(text, corpus, split, cache)
            else:
                text, stats["spm_sentences"] = _train_subwords(d, corpus, settings.get("spm_sample"), log,
                                                                chunk_bytes)
                progress = Progress(log, "the training split", 2 * raw_lines["train"])
                dtype = ids_dtype(len(text.src_vocab))
                for split in corpus.splits:
                    longest[split] = _encode_split(text, corpus, split, cache, dtype,
                                                   progress if split == "train" else None, chunk_bytes)
            tokenize_seconds = time.perf_counter() - t_tok
            stats.update(max_tokens=longest, tokenize_seconds=round(tokenize_seconds, 3),
                         build_seconds=round(time.perf_counter() - t0, 3))
            cache.finish(text, settings, stats)
    except OSError as exc:
        raise DataError(f"cannot write the data cache {folder} ({exc.strerror or exc}); "
                        f"set data.cache_dir to a writable folder with some free space") from None
    if log:
        log(f"tokenised {corpus.name} ({d.tokenizer} mode) in {tokenize_seconds:.1f} s; cached in {folder}")
    return folder
