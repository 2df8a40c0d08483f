"""annotated-transformer: the Transformer of "Attention Is All You Need", as the Annotated Transformer names it.

The public names follow the paper and the notebook, so the two can be read side by side. This
import loads the core only: the README's reading order (attention, model, masks, Batch, loss, rate, the loop,
greedy decoding, the copy task) and runtime/precision.py (autocast). The rest comes from its own package when
first asked for: `Config` and `load_config` from config/ (which loads every extension), `beam_search` and
`decode_batch` from decode/, `train_worker` and `Trainer` from harness/, `Translator` (with `Hypothesis`,
`SentenceAttention`, `TruncationWarning`) from deploy/, and the errors a user can catch (`UserError` and its
kinds) from runtime/errors.py.
"""

from typing import TYPE_CHECKING

from .data.batch import Batch
from .data.copy_task import data_gen
from .decoding import greedy_decode
from .loss import LabelSmoothing, SimpleLossCompute
from .model import (
    Decoder,
    DecoderLayer,
    Embeddings,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    Generator,
    LayerNorm,
    MultiHeadedAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SublayerConnection,
    attention,
    clones,
    make_model,
    subsequent_mask,
)
from .optim import rate
from .loop import TrainState, run_epoch, train_step
from .runtime.lazy import lazy_names

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors (nothing is imported at run time)
    from .config import Config, load_config
    from .decode.beam_search import beam_search
    from .decode.inference import decode_batch
    from .deploy.attention import SentenceAttention
    from .deploy.text_translator import Hypothesis, TruncationWarning
    from .deploy.translator import Translator
    from .harness.trainer import Trainer, train_worker
    from .runtime.errors import CheckpointError, ConfigError, DataError, ExportError, RunDirError, UserError

# Names beyond the core, whose modules pull in the extensions, fast/, the data loaders or the harness (tqdm, the
# checkpoint writer, NVML, ...): loaded on first use (PEP 562).
_LAZY = {"Config": "config", "load_config": "config",
         "beam_search": "decode.beam_search", "decode_batch": "decode.inference",
         "train_worker": "harness.trainer", "Trainer": "harness.trainer", "Translator": "deploy.translator",
         "Hypothesis": "deploy.text_translator", "TruncationWarning": "deploy.text_translator",
         "SentenceAttention": "deploy.attention",
         **{error: "runtime.errors" for error in ("UserError", "ConfigError", "DataError", "CheckpointError",
                                                  "RunDirError", "ExportError")}}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)


__version__ = "0.1.0"

__all__ = [
    "Batch", "Config", "Decoder", "DecoderLayer", "Embeddings", "Encoder", "EncoderDecoder", "EncoderLayer",
    "Generator", "LabelSmoothing", "LayerNorm", "MultiHeadedAttention", "PositionalEncoding",
    "PositionwiseFeedForward", "SimpleLossCompute", "SublayerConnection", "TrainState", "Trainer", "Translator",
    "Hypothesis", "SentenceAttention", "TruncationWarning", "UserError", "ConfigError", "DataError",
    "CheckpointError", "RunDirError", "ExportError",
    "attention", "clones", "beam_search", "data_gen", "decode_batch", "greedy_decode", "load_config", "make_model",
    "rate",
    "run_epoch", "subsequent_mask", "train_step", "train_worker",
]
