"""Data: batches and masks, the copy task, and parallel text, Multi30k or your own files (tokenisation,
vocabulary, batching). The notebook's own data path, kept for the benchmark, is `notebook_pipeline` (not loaded
here).

`Batch` and the copy task are the core's and load with this package; the loaders of parallel text (and so the
tokenizers, the cache and the batch plans) load when one of their names is first asked for, so that
`from annotated_transformer.data.batch import Batch` costs no more than batch.py.
"""

from ..runtime.lazy import lazy_names

from .batch import Batch
from .copy_task import COPY_PAD, COPY_START, data_gen

# name -> the module of this package that defines it, imported on first use (PEP 562)
_LAZY = {
    "TrainLoader": "loader",
    "MULTI30K_FILES": "multi30k", "read_split": "multi30k", "resolve_multi30k_dir": "multi30k",
    "Split": "translation_data", "TranslationData": "translation_data",
    "load_translation_data": "translation_data", "open_corpus": "translation_data",
    "TextPipeline": "text",
    "BOS": "vocab", "EOS": "vocab", "PAD": "vocab", "SPECIALS": "vocab", "UNK": "vocab", "Vocab": "vocab",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


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
