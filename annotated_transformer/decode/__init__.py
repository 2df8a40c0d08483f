"""Decoding beyond the notebook's greedy_decode: incremental decoding with a key/value cache (`greedy_search`),
beam search (the paper decodes with beam 4) and its n-best lists, and many sentences decoded in length-sorted
batches, as training's BLEU, the Translator and the charts do."""

from .beam_search import beam_search, beam_search_n_best
from .incremental import greedy_search
from .inference import decode_batch, decode_n_best, translate_ids

__all__ = ["beam_search", "beam_search_n_best", "decode_batch", "decode_n_best", "greedy_search", "translate_ids"]
