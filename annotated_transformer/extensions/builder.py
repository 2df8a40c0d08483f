"""From a Config to the model, its loss, its training objective and its optimizer, the extensions that are on
installed: the one place where a config's switches reach the code. Each extension says how it is installed (its
registration's `kind` and `install`, sections.KINDS); this module calls the `install` of every extension the
config switches on, kind by kind, in the extensions' order, and imports none of them.

    model = build_model(cfg, src_vocab, tgt_vocab)   # make_model, then the model extensions that are on
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config import Config
from ..data.loader import Resegment
from ..runtime.device import resolve_amp_dtype
from ..fast import FusedLossCompute, fused_adam_pays, speed_up
from ..loop import Objective
from ..loss import LabelSmoothing, SimpleLossCompute
from ..model import EncoderDecoder, make_model
from ..optim import build_optimizer


def build_model(cfg: Config, src_vocab: int, tgt_vocab: int) -> EncoderDecoder:
    """`make_model` with the `model` section's fields, then the model extensions the config switches on."""
    m = cfg.model
    model = make_model(src_vocab, tgt_vocab, N=m.N, d_model=m.d_model, d_ff=m.d_ff, h=m.h, dropout=m.dropout,
                       norm_first=m.norm_first, tie_embeddings=m.tie_embeddings,
                       fused_attention={"auto": None, "fused": True, "explicit": False}[m.attention_kernel],
                       max_positions=m.max_positions,
                       layer_norm_eps=m.layer_norm_eps, N_dec=m.N_dec or None,
                       attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout)
    for extension in cfg.extensions_on("model"):  # a subclass on the same weights each
        model = extension.install(cfg, model)
    return model


def build_training(cfg: Config, src_vocab: int, tgt_vocab: int, pad: int, device: torch.device
                   ) -> tuple[EncoderDecoder, SimpleLossCompute, Objective | None, torch.optim.Optimizer,
                              torch.dtype | None]:
    """Model (on `device`), loss, training objective (None: teacher forcing), optimizer and autocast dtype.

    The model, loss and optimizer are the notebook's with `fast/`'s speed installed on them (same results).
    The schedule needs the loader's length, so the Trainer builds it."""
    t = cfg.train
    model = speed_up(build_model(cfg, src_vocab, tgt_vocab).to(device))
    loss_compute = FusedLossCompute(model.generator, LabelSmoothing(tgt_vocab, pad, t.label_smoothing))
    objective = None  # validate() lets only objectives that combine be on together: each wraps the one before
    for extension in cfg.extensions_on("objective"):
        objective = extension.install(cfg, model, pad, objective)
    optimizer = build_optimizer(model, betas=tuple(t.adam_betas), eps=t.adam_eps, fused=fused_adam_pays(model))
    return model, loss_compute, objective, optimizer, resolve_amp_dtype(t.precision, device)


def build_ema(cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """The moving average of the weights (ema.WeightAverage), updated after every optimizer step; None when off."""
    average = None
    for extension in cfg.extensions_on("weight average"):
        average = extension.install(cfg, model, optimizer)
    return average


def build_resegmentation(cfg: Config, data: Any) -> Resegment | None:
    """The training data's ids for each epoch (`data`: a TranslationData), each resegmentation that is on wrapping
    the one before it (e.g. bidirectional training's reversed pairs of subword sampling's ids), or None when all are
    off: the cached ids every epoch."""
    resegment = None
    for extension in cfg.extensions_on("resegmentation"):
        resegment = extension.install(cfg, data, resegment)
    return resegment
