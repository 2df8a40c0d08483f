"""Data: batches and masks, the copy task, and Multi30k."""

from .batch import Batch
from .copy_task import COPY_PAD, COPY_START, data_gen

__all__ = ["Batch", "data_gen", "COPY_PAD", "COPY_START"]
