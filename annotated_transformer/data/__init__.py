"""Data: batches and masks, the copy task, and parallel text, Multi30k or your own files (tokenisation,
vocabulary, batching). The notebook's own data path, kept for the benchmark, is `notebook_pipeline` (not loaded
here)."""

from .batch import Batch
from .copy_task import COPY_PAD, COPY_START, data_gen
from .loader import TrainLoader
from .multi30k import MULTI30K_FILES, read_split, resolve_multi30k_dir
from .translation_data import Split, TranslationData, load_translation_data, open_corpus
from .text import TextPipeline
from .vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab

__all__ = [
    "BOS",
    "COPY_PAD",
    "COPY_START",
    "EOS",
    "MULTI30K_FILES",
    "PAD",
    "SPECIALS",
    "UNK",
    "Batch",
    "Split",
    "TextPipeline",
    "TrainLoader",
    "TranslationData",
    "Vocab",
    "data_gen",
    "load_translation_data",
    "open_corpus",
    "read_split",
    "resolve_multi30k_dir",
]
