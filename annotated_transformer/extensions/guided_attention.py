"""Guided attention (Tachibana et al. 2017): a loss on encoder-decoder attention far from the diagonal.

Target position t of T usually draws on source positions near t/T of the source, so attention
weight at (t, s) costs W[t, s] = 1 - exp(-(s/S - t/T)^2 / (2 g^2)), over each sentence's real
(unpadded) lengths; padding costs nothing. The penalty is sum_t sum_s A[t, s] W[t, s], summed over
a batch's real target positions like the cross-entropy it is added to, averaged over the guided
heads and layers, and weighted by lambda. German puts verbs last, so a hard diagonal would be
wrong for some words: guide a few heads, with a wide g, and let the weight decay.

`GuidedAttentionObjective` adds the penalty to the loss of the objective before it (scheduled sampling's when
that is on too, else the plain teacher-forced step); `train_step` calls it when `guided_attention.weight` > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention import MultiHeadedAttention
from ..data.batch import Batch
from ..loop import Objective, unwrap_model
from ..loss import SimpleLossCompute
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, not_negative, param


@dataclass
class GuidedAttentionConfig:
    """Guided attention (extensions/guided_attention.py); off by default."""

    weight: float = param(0.0, "weight (lambda) of the penalty on encoder-decoder attention far from the diagonal "
                          "(Tachibana et al. 2017) (0: off)")
    sigma: float = param(0.2, "width g of the allowed band, in fractions of the lengths")
    layers: list[int] = param([], "decoder layers it applies to, from 0 (empty: all)")
    heads: list[int] = param([], "heads it applies to, from 0 (empty: all)")
    decay_steps: int = param(0, "the weight falls linearly to 0 over this many optimizer steps (0: constant)")


class ProbsForLoss:
    """An attention hook: in training, the layer's latest probabilities with their gradient, for the penalty."""

    def __init__(self) -> None:
        self.probs: Tensor | None = None  # (B, h, T, S), before dropout

    def needs_probs(self, attn: MultiHeadedAttention) -> bool:
        """In training only: evaluation and decoding keep the fused kernel."""
        return attn.training

    def __call__(self, attn: MultiHeadedAttention, keys: Tensor, probs: Tensor | None) -> None:
        self.probs = probs if attn.training else None


def guide_weights(src_len: Tensor, tgt_len: Tensor, S: int, T: int, sigma: float) -> Tensor:
    """(B,) real lengths -> W (B, T, S): 1 - exp(-(s/S_b - t/T_b)^2 / (2 sigma^2)), 0 outside the real lengths."""
    pos_s = torch.arange(S, device=src_len.device).unsqueeze(0)  # (1, S)
    pos_t = torch.arange(T, device=tgt_len.device).unsqueeze(0)  # (1, T)
    s = pos_s / src_len.unsqueeze(1).clamp(min=1)  # (B, S)
    t = pos_t / tgt_len.unsqueeze(1).clamp(min=1)  # (B, T)
    w = 1.0 - torch.exp(-(s.unsqueeze(1) - t.unsqueeze(2)) ** 2 / (2 * sigma ** 2))  # (B, T, S)
    real = (pos_t < tgt_len.unsqueeze(1)).unsqueeze(2) & (pos_s < src_len.unsqueeze(1)).unsqueeze(1)  # (B, T, S)
    return w * real


def guided_attention_penalty(probs: Tensor, weights: Tensor) -> Tensor:
    """probs (B, h, T, S) attention of the guided heads, weights (B, T, S) -> the penalty summed over
    positions, averaged over heads (a scalar, fp32)."""
    return (probs.float() * weights.unsqueeze(1)).sum() / probs.size(1)


def decayed_weight(step: int, weight: float, decay_steps: int) -> float:
    """lambda at optimizer step `step`: constant, or falling linearly to 0 over `decay_steps`."""
    if decay_steps <= 0:
        return weight
    return weight * max(0.0, 1.0 - step / decay_steps)


class GuidedAttentionObjective:
    """Loss of one training micro-batch with the penalty added: (summed loss for logging, loss divided by `norm`)."""

    def __init__(self, cfg: GuidedAttentionConfig, model: nn.Module, pad: int, inner: Objective | None = None) -> None:
        self.cfg, self.pad, self.inner = cfg, pad, inner  # inner: the objective it adds to (None: teacher forcing)
        self.guided: list[ProbsForLoss] = []  # one hook per guided layer's encoder-decoder attention
        layers = unwrap_model(model).decoder.layers
        for i in cfg.layers or range(len(layers)):
            self.guided.append(ProbsForLoss())  # these layers run the explicit attention in training
            layers[i].src_attn.hooks.append(self.guided[-1])
        self.last_penalty: Tensor | None = None  # the latest penalty per target token (before lambda)
        # model FLOPs of a step relative to a plain one: the inner objective's
        self.compute_factor = getattr(inner, "compute_factor", 1.0)

    def penalty(self, batch: Batch, step: int) -> Tensor | None:
        """lambda x the guided-attention penalty of the forward pass just run (None when its weight is 0 now)."""
        weight = decayed_weight(step, self.cfg.weight, self.cfg.decay_steps)
        if weight == 0.0:
            for hook in self.guided:
                hook.probs = None  # drop the graph they hold
            return None
        src_len = (batch.src != self.pad).sum(1)  # (B,)
        tgt_len = (batch.tgt != self.pad).sum(1)  # (B,)
        w = guide_weights(src_len, tgt_len, batch.src.size(1), batch.tgt.size(1), self.cfg.sigma)  # (B, T, S)
        total = 0.0
        for hook in self.guided:
            probs = hook.probs if not self.cfg.heads else hook.probs[:, self.cfg.heads]  # (B, h', T, S)
            total = total + guided_attention_penalty(probs, w)
            hook.probs = None  # the graph keeps what backward needs
        self.last_penalty = total.detach() / len(self.guided) / tgt_len.sum().clamp(min=1)  # per target token
        return weight * total / len(self.guided)

    def figures(self) -> dict[str, float]:
        """What the log records: the inner objective's figures and the penalty per token of the latest step."""
        out = self.inner.figures() if self.inner is not None else {}
        if self.last_penalty is not None:
            out["guide_penalty"] = self.last_penalty.item()
        return out

    def __call__(self, model: nn.Module, batch: Batch, loss_compute: SimpleLossCompute, norm: float,
                 step: int) -> tuple[Tensor, Tensor]:
        """The inner objective's forward and loss (or the teacher-forced ones), and the penalty before dividing by
        `norm`."""
        if self.inner is not None:
            batch_loss, loss = self.inner(model, batch, loss_compute, norm, step)
        else:
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
            batch_loss, loss = loss_compute(out, batch.tgt_y, norm)
        extra = self.penalty(batch, step)
        if extra is not None:
            loss = loss + extra / norm
        return batch_loss, loss


def validate(cfg: CoreConfig) -> None:
    """The guided_attention section's rules, and what they need from the model."""
    ga, m = cfg.guided_attention, cfg.model
    not_negative({"guided_attention.decay_steps": ga.decay_steps, "guided_attention.weight": ga.weight})
    if ga.sigma <= 0:
        raise ConfigError(f"guided_attention.sigma must be positive, got {ga.sigma}")
    layers = m.N_dec or m.N
    if any(not 0 <= i < layers for i in ga.layers):
        raise ConfigError(f"guided_attention.layers {ga.layers} names a layer outside the decoder's "
                          f"0..{layers - 1}")
    if any(not 0 <= i < m.h for i in ga.heads):
        raise ConfigError(f"guided_attention.heads {ga.heads} names a head outside 0..{m.h - 1}")


EXTENSION = Extension(
    name="guided_attention", section=GuidedAttentionConfig, help="guided attention", order=40, kind="objective",
    on=lambda section: bool(section.weight),
    install=lambda cfg, model, pad, objective: GuidedAttentionObjective(cfg.guided_attention, model, pad, objective),
    validate=validate, combines=True,
    arms={"guided attention": ("guided_attention.weight=0.5", "guided_attention.heads=[0,1]")},
)
