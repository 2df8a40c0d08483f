"""Token cutoff (Shen et al. 2020): whole source tokens erased at random in training, a regulariser at no cost.

Shen et al. erase a token by zeroing its embedding vector (and add a consistency loss between
several erased copies, which costs extra passes like R-Drop's). Here a cut token becomes `<unk>`,
whose embedding is learned, and there is one pass: the decoder still attends to the position
(its positional encoding and the `<unk>` vector stand in for the word), so the model learns not
to lean on any single source word. `<s>`, `</s>` and padding are never cut; validation, test and
decoding see the whole sentence.

`train_step` calls `CutoffObjective(model, batch, loss_compute, norm, step)` instead of its own
forward when `cutoff.rate` > 0 (`build_cutoff` returns None otherwise). Its draws come from
PyTorch's generator, as dropout's do, so a resumed run makes the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.batch import Batch
from ..data.vocab import BOS, EOS, PAD, UNK
from ..loss import SimpleLossCompute
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, param


@dataclass
class CutoffConfig:
    """Token cutoff (extensions/cutoff.py): source tokens replaced by <unk> at random in training; off by default."""

    rate: float = param(0.0, "probability that each source token (not <s>, </s> or padding) becomes <unk> in a "
                        "training batch (Shen et al. 2020; 0: off); validation and decoding see whole sentences")


def cut_tokens(src: Tensor, rate: float, unk: int = UNK, keep: tuple[int, ...] = (BOS, EOS, PAD)
               ) -> tuple[Tensor, Tensor]:
    """src (B, S) ids with each token not in `keep` replaced by `unk` with probability `rate` (a new tensor),
    and the (B, S) boolean mask of the positions cut."""
    cut = torch.rand(src.shape, device=src.device) < rate  # (B, S)
    for special in keep:
        cut &= src != special
    return src.masked_fill(cut, unk), cut


class CutoffObjective:
    """Loss of one training micro-batch on a source with tokens cut: (summed loss for logging, loss / `norm`)."""

    compute_factor = 1.0  # model FLOPs of a step relative to a plain one: the same single pass

    def __init__(self, rate: float) -> None:
        self.rate = rate
        # share of the latest micro-batch's source tokens (<s> and </s> counted) cut, for logs and tests
        self.last_cut: Tensor | None = None

    def __call__(self, model: nn.Module, batch: Batch, loss_compute: SimpleLossCompute, norm: float,
                 step: int) -> tuple[Tensor, Tensor]:
        """The teacher-forced loss with `cut_tokens` applied to the source; masks and targets unchanged."""
        src, cut = cut_tokens(batch.src, self.rate)  # (B, S) each
        self.last_cut = cut.sum() / (batch.src != PAD).sum().clamp(min=1)  # read when logged: no sync
        out = model(src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
        return loss_compute(out, batch.tgt_y, norm)

    def figures(self) -> dict[str, float]:
        """What the log records: the share of source tokens cut in the latest step."""
        return {} if self.last_cut is None else {"cutoff_share": self.last_cut.item()}


def build_cutoff(rate: float) -> CutoffObjective | None:
    """The cutoff objective, or None when the switch is off (the plain teacher-forced step)."""
    return CutoffObjective(rate) if rate > 0 else None


def validate(cfg: CoreConfig) -> None:
    """The cutoff section's rules, and what they need from the data."""
    rate = cfg.cutoff.rate
    if not 0 <= rate < 1:
        raise ConfigError(f"cutoff.rate must be in [0, 1) (0: off; 0.1 cuts one source token in ten), got {rate}")
    if rate and cfg.data.dataset == "copy":
        raise ConfigError("cutoff replaces source words by <unk>, which the copy task has not: use it with "
                          "data.dataset=multi30k or files, or cutoff.rate=0")


EXTENSION = Extension(
    name="cutoff", section=CutoffConfig, help="token cutoff", order=70, kind="objective",
    on=lambda section: bool(section.rate),
    install=lambda cfg, model, pad, objective: build_cutoff(cfg.cutoff.rate),
    validate=validate, arms={"token cutoff 0.1": ("cutoff.rate=0.1",)},
)
