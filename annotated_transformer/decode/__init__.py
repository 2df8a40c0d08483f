"""Decoding beyond the notebook's greedy_decode: incremental decoding with a key/value cache (`greedy_search`),
beam search (the paper decodes with beam 4), and many sentences decoded in length-sorted batches, as training's
BLEU, the Translator and the charts do."""

from .beam_search import beam_search
from .incremental import greedy_search
from .inference import decode_batch, translate_ids

__all__ = ["beam_search", "decode_batch", "greedy_search", "translate_ids"]
