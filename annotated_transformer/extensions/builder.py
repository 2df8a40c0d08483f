"""From a Config to the model, its loss, its training objective and its optimizer, the extensions that are on
installed: the one place where a config's switches reach the code. Each extension says how it is installed (its
registration's `kind` and `install`, sections.KINDS); this module calls the `install` of every extension the
config switches on, kind by kind, in the extensions' order, and imports none of them.

    model = build_model(cfg, src_vocab, tgt_vocab)   # make_model, then the model extensions that are on
    training = build_training(cfg, src_vocab, tgt_vocab, pad, device)   # the notebook's parts, the speed plan, ema
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from ..config import Config
from ..data.loader import Resegment
from ..runtime.device import resolve_amp_dtype
from ..fast.plan import speed_up_training
from ..loop import Objective
from ..loss import LabelSmoothing, SimpleLossCompute
from ..model import EncoderDecoder, make_model
from ..optim import build_optimizer


def build_model(cfg: Config, src_vocab: int, tgt_vocab: int) -> EncoderDecoder:
    """`make_model` with the `model` section's fields, then the model extensions the config switches on."""
    m = cfg.model
    model = make_model(src_vocab, tgt_vocab, N=m.N, d_model=m.d_model, d_ff=m.d_ff, h=m.h, dropout=m.dropout,
                       norm_first=m.norm_first, tie_embeddings=m.tie_embeddings, max_positions=m.max_positions,
                       layer_norm_eps=m.layer_norm_eps, N_dec=m.N_dec or None,
                       attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout)
    for extension in cfg.extensions_on("model"):  # a subclass on the same weights each
        model = extension.install(cfg, model)
    return model


class Training(NamedTuple):
    """What a training run steps: `build_training`'s parts."""

    model: EncoderDecoder  # on its device, the speed plan installed on it (what checkpoints save and decoding runs)
    loss_compute: SimpleLossCompute
    objective: Objective | None  # None: teacher forcing
    optimizer: torch.optim.Optimizer
    amp_dtype: torch.dtype | None  # autocast's, None: fp32
    step_model: nn.Module  # what the training step calls: `model`, or compiled as train.compile says
    ema: Any  # the weight average the optimizer updates after each step (`build_ema`), None when ema.decay is 0


def build_training(cfg: Config, src_vocab: int, tgt_vocab: int, pad: int, device: torch.device) -> Training:
    """Model (on `device`), loss, training objective, optimizer, autocast dtype, the module the step calls and the
    weight average.

    The notebook's model, loss and optimizer, then the speed plan on them (`fast.speed_up_training`, unless
    train.fast=false): the one place training's speed is installed. The schedule needs the loader's length, so
    the Trainer builds it."""
    t = cfg.train
    model = build_model(cfg, src_vocab, tgt_vocab).to(device)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(tgt_vocab, pad, t.label_smoothing))
    objective = None  # validate() lets only objectives that combine be on together: each wraps the one before
    for extension in cfg.extensions_on("objective"):
        objective = extension.install(cfg, model, pad, objective)
    optimizer = build_optimizer(model, betas=tuple(t.adam_betas), eps=t.adam_eps)
    step_model, loss_compute, optimizer = speed_up_training(
        model, loss_compute, optimizer, fast=t.fast, attention_kernel=cfg.model.attention_kernel, compile=t.compile)
    ema = build_ema(cfg, model, optimizer)  # on the optimizer that steps (the speed plan may have replaced it)
    return Training(model, loss_compute, objective, optimizer, resolve_amp_dtype(t.precision, device), step_model, ema)


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
