"""`Batch`: a source/target pair of padded id tensors with the masks the model needs."""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import padding_mask, subsequent_mask


class Batch:
    """Holds a batch of sentences for training, with masks (True = may attend).

    src (B, S); tgt (B, T+1) including <s> ... </s>. The decoder reads `tgt` = tgt[:, :-1]
    and is trained to predict `tgt_y` = tgt[:, 1:] (teacher forcing). `ntokens` counts the
    non-padding tokens of `tgt_y` on the host, so dividing by it never waits for the GPU;
    `global_ntokens` sums it over every rank's batch at this step (set by the training loaders).
    """

    def __init__(self, src: Tensor, tgt: Tensor | None = None, pad: int = 2) -> None:
        self.pad = pad
        self.src = src
        self.src_mask = padding_mask(src, pad)  # (B, 1, S)
        self.ntokens = 0
        self.global_ntokens: int | None = None
        if tgt is not None:
            self.tgt = tgt[:, :-1]  # (B, T)
            self.tgt_y = tgt[:, 1:]  # (B, T)
            self.tgt_mask = self.make_std_mask(self.tgt, pad)  # (B, T, T)
            self.ntokens = int((self.tgt_y != pad).sum())

    @staticmethod
    def make_std_mask(tgt: Tensor, pad: int) -> Tensor:
        """Hide padding and future words: (B, T) -> (B, T, T)."""
        return padding_mask(tgt, pad) & subsequent_mask(tgt.size(-1), device=tgt.device)

    def __len__(self) -> int:
        return self.src.size(0)

    def pin_memory(self) -> Batch:
        """Page-lock every tensor (called by the DataLoader when pin_memory=True)."""
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, value.pin_memory())
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Move every tensor to `device` (a new Batch; `ntokens` is kept)."""
        out = object.__new__(Batch)
        for name, value in vars(self).items():
            setattr(out, name, value.to(device, non_blocking=non_blocking) if isinstance(value, Tensor) else value)
        return out
