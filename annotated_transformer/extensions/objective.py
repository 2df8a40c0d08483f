"""The training step's loss with the objective's extensions: scheduled sampling and guided attention.

`train_step` calls `TrainingObjective(model, batch, loss_compute, norm, step)` instead of its own
teacher-forced forward when the config switches one of them on (the `scheduled_sampling` and
`guided_attention` sections; `build_objective` returns None otherwise, so a run with both off
executes exactly the plain step).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import GuidedAttentionConfig, ScheduledSamplingConfig
from ..data.batch import Batch
from ..loop import unwrap_model
from ..loss import SimpleLossCompute
from .guided_attention import ProbsForLoss, decayed_weight, guide_weights, guided_attention_penalty
from .scheduled_sampling import mix_inputs, predictions, replace_probability


class TrainingObjective:
    """Loss of one training micro-batch: (summed loss for logging, loss divided by `norm`)."""

    def __init__(self, sampling: ScheduledSamplingConfig, guided: GuidedAttentionConfig, model: nn.Module,
                 pad: int) -> None:
        self.ss, self.ga, self.pad = sampling, guided, pad
        self.guided: list[ProbsForLoss] = []  # one hook per guided layer's encoder-decoder attention
        if guided.weight > 0:
            layers = unwrap_model(model).decoder.layers
            for i in guided.layers or range(len(layers)):
                self.guided.append(ProbsForLoss())  # these layers run the explicit attention in training
                layers[i].src_attn.hooks.append(self.guided[-1])
        self.last_p = 0.0  # the replacement probability of the latest step (for tests and logs)
        self.last_penalty: Tensor | None = None  # the latest guided penalty per target token (before lambda)
        # model FLOPs of a step relative to a plain one: scheduled sampling adds a forward pass (a third of a
        # step; counted from the start, also while its probability is still 0 and the pass is skipped)
        self.compute_factor = 4 / 3 if sampling.rate else 1.0

    def decoder_input(self, model: nn.Module, batch: Batch, step: int) -> Tensor:
        """The gold decoder input, or the scheduled-sampling mix of it with the first pass's predictions."""
        c = self.ss
        self.last_p = p = replace_probability(step, c.rate, c.schedule, c.start, c.steps)
        if p == 0.0:
            return batch.tgt
        with torch.no_grad():
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d), teacher-forced
            guess = predictions(unwrap_model(model).generator.logits(out), c.sample)  # (B, T)
        return mix_inputs(batch.tgt, batch.tgt_y, guess, p, self.pad)

    def penalty(self, batch: Batch, step: int) -> Tensor | None:
        """lambda x the guided-attention penalty of the forward pass just run (None when its weight is 0 now)."""
        weight = decayed_weight(step, self.ga.weight, self.ga.decay_steps)
        if weight == 0.0:
            for hook in self.guided:
                hook.probs = None  # drop the graph they hold
            return None
        src_len = (batch.src != self.pad).sum(1)  # (B,)
        tgt_len = (batch.tgt != self.pad).sum(1)  # (B,)
        w = guide_weights(src_len, tgt_len, batch.src.size(1), batch.tgt.size(1), self.ga.sigma)  # (B, T, S)
        total = 0.0
        for hook in self.guided:
            probs = hook.probs if not self.ga.heads else hook.probs[:, self.ga.heads]  # (B, h', T, S)
            total = total + guided_attention_penalty(probs, w)
            hook.probs = None  # the graph keeps what backward needs
        self.last_penalty = total.detach() / len(self.guided) / tgt_len.sum().clamp(min=1)  # per target token
        return weight * total / len(self.guided)

    def figures(self) -> dict[str, float]:
        """What the log records: the replacement probability and the penalty per token of the latest step."""
        out = {"ss_p": self.last_p} if self.ss.rate else {}
        if self.last_penalty is not None:
            out["guide_penalty"] = self.last_penalty.item()
        return out

    def __call__(self, model: nn.Module, batch: Batch, loss_compute: SimpleLossCompute, norm: float,
                 step: int) -> tuple[Tensor, Tensor]:
        """Forward (one or two passes), the loss, and the penalty added before dividing by `norm`."""
        tgt = self.decoder_input(model, batch, step)
        out = model(batch.src, tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d)
        batch_loss, loss = loss_compute(out, batch.tgt_y, norm)
        extra = self.penalty(batch, step)
        if extra is not None:
            loss = loss + extra / norm
        return batch_loss, loss


def build_objective(sampling: ScheduledSamplingConfig, guided: GuidedAttentionConfig, model: nn.Module,
                    pad: int) -> TrainingObjective | None:
    """The objective the config asks for, or None for the plain teacher-forced loss."""
    if sampling.rate == 0.0 and guided.weight == 0.0:
        return None
    return TrainingObjective(sampling, guided, model, pad)
