"""From a Config to the model, its loss, its training objective and its optimizer, the extensions that are on
installed: the one place where a config's switches reach the code.

    model = build_model(cfg, src_vocab, tgt_vocab)   # make_model, then local attention / token merging if on
"""

from __future__ import annotations

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
from .bidirectional import direction_sampling
from .cutoff import build_cutoff
from .ema import WeightAverage, build_weight_average
from .local_attention import with_local_attention
from .objective import build_objective
from .r_drop import build_r_drop
from .subword_sampling import sampled_segmentation
from .token_merging import with_token_merging


def build_model(cfg: Config, src_vocab: int, tgt_vocab: int) -> EncoderDecoder:
    """`make_model` with the `model` section's fields, then the model extensions the config switches on."""
    m = cfg.model
    model = make_model(src_vocab, tgt_vocab, N=m.N, d_model=m.d_model, d_ff=m.d_ff, h=m.h, dropout=m.dropout,
                       norm_first=m.norm_first, tie_embeddings=m.tie_embeddings,
                       fused_attention={"auto": None, "fused": True, "explicit": False}[m.attention_kernel],
                       max_positions=m.max_positions,
                       layer_norm_eps=m.layer_norm_eps, N_dec=m.N_dec or None,
                       attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout)
    model = with_local_attention(model, cfg.local_attention.window)
    tm = cfg.token_merging
    return with_token_merging(model, tm.merge_ratio, tm.prune_ratio, tuple(tm.layers), tm.proportional_attention)


def build_training(cfg: Config, src_vocab: int, tgt_vocab: int, pad: int, device: torch.device
                   ) -> tuple[EncoderDecoder, SimpleLossCompute, Objective | None, torch.optim.Optimizer,
                              torch.dtype | None]:
    """Model (on `device`), loss, training objective (None: teacher forcing), optimizer and autocast dtype.

    The model, loss and optimizer are the notebook's with `fast/`'s speed installed on them (same results).
    The schedule needs the loader's length, so the Trainer builds it."""
    t = cfg.train
    model = speed_up(build_model(cfg, src_vocab, tgt_vocab).to(device))
    loss_compute = FusedLossCompute(model.generator, LabelSmoothing(tgt_vocab, pad, t.label_smoothing))
    # validate() lets at most one of them be on
    objective = (build_r_drop(cfg.r_drop.alpha, pad) or build_cutoff(cfg.cutoff.rate)
                 or build_objective(cfg.scheduled_sampling, cfg.guided_attention, model, pad))
    optimizer = build_optimizer(model, betas=tuple(t.adam_betas), eps=t.adam_eps, fused=fused_adam_pays(model))
    return model, loss_compute, objective, optimizer, resolve_amp_dtype(t.precision, device)


def build_ema(cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> WeightAverage | None:
    """The exponential moving average of the weights, updated after every optimizer step; None when off."""
    return build_weight_average(cfg.ema.decay, model, optimizer)


def build_resegmentation(cfg: Config, data) -> Resegment | None:
    """The training data's ids for each epoch (subword sampling, then bidirectional training's reversed pairs),
    or None when both are off: the cached ids every epoch."""
    sampled = sampled_segmentation(cfg.subword_sampling, data, cfg.train.seed)
    train = data.splits["train"]
    base = sampled or (lambda epoch: (train.src, train.tgt))
    bi = cfg.bidirectional
    return direction_sampling(base, bi.epochs, bi.rate, cfg.train.seed) or sampled
