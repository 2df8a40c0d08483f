"""annotated-transformer: the Transformer of "Attention Is All You Need", as the Annotated Transformer names it.

The public names follow the paper and the notebook, so the two can be read side by side. This
import loads the core only (model, masks and Batch, loss, rate, the loop, decoding, config);
`train_worker` and `Trainer` come from harness/, `Translator` from deploy/, when first asked for.
"""

from typing import Any

from .config import Config, load_config
from .data import Batch, data_gen
from .decode.beam_search import beam_search
from .decoding import greedy_decode
from .decode.inference import decode_batch
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

# Names whose modules pull in the harness (tqdm, the checkpoint writer, NVML, ...): loaded on first use.
_LAZY = {"train_worker": "harness.trainer", "Trainer": "harness.trainer", "Translator": "deploy.translator"}


def __getattr__(name: str) -> Any:
    """`annotated_transformer.train_worker` and friends, imported when first used."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "Batch", "Config", "Decoder", "DecoderLayer", "Embeddings", "Encoder", "EncoderDecoder", "EncoderLayer",
    "Generator", "LabelSmoothing", "LayerNorm", "MultiHeadedAttention", "PositionalEncoding",
    "PositionwiseFeedForward", "SimpleLossCompute", "SublayerConnection", "TrainState", "Trainer", "Translator",
    "attention", "clones", "beam_search", "data_gen", "decode_batch", "greedy_decode", "load_config", "make_model",
    "rate",
    "run_epoch", "subsequent_mask", "train_step", "train_worker",
]
