"""annotated-transformer: the Transformer of "Attention Is All You Need", as the Annotated Transformer names it.

The public names follow the paper and the notebook, so the two can be read side by side.
"""

from .config import Config, load_config
from .data import Batch, data_gen
from .decoding import beam_search, decode_batch, greedy_decode
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
from .training import TrainState, run_epoch, train_worker
from .translator import Translator

__version__ = "0.1.0"

__all__ = [
    "Batch", "Config", "Decoder", "DecoderLayer", "Embeddings", "Encoder", "EncoderDecoder", "EncoderLayer",
    "Generator", "LabelSmoothing", "LayerNorm", "MultiHeadedAttention", "PositionalEncoding",
    "PositionwiseFeedForward", "SimpleLossCompute", "SublayerConnection", "TrainState", "attention", "clones",
    "Translator", "beam_search", "data_gen", "decode_batch", "greedy_decode", "load_config", "make_model", "rate",
    "run_epoch", "subsequent_mask", "train_worker",
]
