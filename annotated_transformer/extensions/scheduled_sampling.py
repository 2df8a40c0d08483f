"""Scheduled sampling for the Transformer, in two decoder passes (Mihaylova & Martins 2019).

Teacher forcing feeds the decoder the gold previous token; at test time it sees its own guesses
(exposure bias). A Transformer decodes every position at once, so the guesses come from a first
pass: teacher-forced, without gradients. Each gold token is then replaced by the first pass's
prediction of it with probability p, and the second pass, on the mixed input, gives the loss.

The mixing happens in label space and is then shifted right: the prediction *for* output i
becomes the input at position i+1, exactly where the gold token i sat. `<s>` and padding stay,
and the masks are the gold tokens' masks. p rises from 0 after `start` along a schedule of the
teacher-forcing probability e(s), s = step - start (Bengio et al. 2015): p = rate * (1 - e(s)).

`train_step` calls `ScheduledSamplingObjective(model, batch, loss_compute, norm, step)` instead of its own
teacher-forced forward when `scheduled_sampling.rate` > 0; guided attention, when on too, wraps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.batch import Batch
from ..loop import unwrap_model
from ..loss import SimpleLossCompute
from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, not_negative, param


@dataclass
class ScheduledSamplingConfig:
    """Scheduled sampling (extensions/scheduled_sampling.py); off by default."""

    rate: float = param(0.0, "the largest probability of replacing a decoder input by the model's own prediction "
                        "from a first, teacher-forced pass (0: off, teacher forcing)")
    schedule: str = param("linear", "how the replacement probability grows to `rate` after `start`: 'constant' "
                          "(at once), 'linear' (over `steps`), 'exponential' (1 - exp(-s/steps)) or "
                          "'inverse_sigmoid' (Bengio et al.: 1 - k/(k + exp(s/k)), k = steps)",
                          choices=("constant", "linear", "exponential", "inverse_sigmoid"))
    start: int = param(0, "the optimizer step where mixing starts (teacher forcing before)")
    steps: int = param(1000, "the schedule's length scale in optimizer steps")
    sample: bool = param(False, "draw the predictions from the softmax instead of the argmax")


def replace_probability(step: int, rate: float, schedule: str, start: int, steps: int) -> float:
    """p at optimizer step `step`: 0 before `start`, then rate * (1 - e), e the teacher-forcing probability."""
    if rate == 0.0 or step < start:
        return 0.0
    s = step - start
    if schedule == "constant":
        teacher = 0.0
    elif schedule == "linear":
        teacher = max(0.0, 1.0 - s / steps)
    elif schedule == "exponential":
        teacher = math.exp(-s / steps)
    elif schedule == "inverse_sigmoid":
        teacher = steps / (steps + math.exp(min(s / steps, 700.0)))  # Bengio et al.'s k / (k + exp(s / k))
    else:
        raise ValueError(f"unknown scheduled-sampling schedule {schedule!r}")
    return rate * (1.0 - teacher)


def predictions(logits: Tensor, sample: bool) -> Tensor:
    """(B, T, V) first-pass scores -> (B, T) token ids: the argmax, or a draw from the softmax."""
    if not sample:
        return logits.argmax(-1)
    probs = logits.float().softmax(-1)  # (B, T, V)
    return torch.multinomial(probs.flatten(0, 1), 1).view(logits.shape[:-1])


def mix_inputs(tgt: Tensor, tgt_y: Tensor, guess: Tensor, p: float, pad: int) -> Tensor:
    """The second pass's decoder input (B, T).

    tgt: the gold input (<s> y_1 .. y_{T-1}); tgt_y: the gold outputs (y_1 .. y_T); guess: the first
    pass's prediction of each tgt_y. Each real gold output is replaced by its guess with probability
    p (never by padding), then the mix is shifted right behind the gold `<s>`.
    """
    replace = torch.rand(tgt_y.shape, device=tgt_y.device) < p  # (B, T)
    replace &= (tgt_y != pad) & (guess != pad)
    mixed_y = torch.where(replace, guess, tgt_y)  # (B, T), in label space
    return torch.cat([tgt[:, :1], mixed_y[:, :-1]], dim=1)  # (B, T): input i+1 is the token for output i


class ScheduledSamplingObjective:
    """Loss of one training micro-batch on the mixed decoder input: (summed loss for logging, loss / `norm`)."""

    # model FLOPs of a step relative to a plain one: the first pass adds a forward (a third of a step; counted from
    # the start, also while the probability is still 0 and the pass is skipped)
    compute_factor = 4 / 3

    def __init__(self, cfg: ScheduledSamplingConfig, pad: int) -> None:
        self.cfg, self.pad = cfg, pad
        self.last_p = 0.0  # the replacement probability of the latest step (for tests and logs)

    def decoder_input(self, model: nn.Module, batch: Batch, step: int) -> Tensor:
        """The gold decoder input, or its mix with the first pass's predictions."""
        c = self.cfg
        self.last_p = p = replace_probability(step, c.rate, c.schedule, c.start, c.steps)
        if p == 0.0:
            return batch.tgt
        with torch.no_grad():
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, d), teacher-forced
            guess = predictions(unwrap_model(model).generator.logits(out), c.sample)  # (B, T)
        return mix_inputs(batch.tgt, batch.tgt_y, guess, p, self.pad)

    def __call__(self, model: nn.Module, batch: Batch, loss_compute: SimpleLossCompute, norm: float,
                 step: int) -> tuple[Tensor, Tensor]:
        """The second pass, on the mixed input, and its loss (masks and targets: the gold ones)."""
        out = model(batch.src, self.decoder_input(model, batch, step), batch.src_mask, batch.tgt_mask)  # (B, T, d)
        return loss_compute(out, batch.tgt_y, norm)

    def figures(self) -> dict[str, float]:
        """What the log records: the replacement probability of the latest step."""
        return {"ss_p": self.last_p}


def validate(cfg: CoreConfig) -> None:
    """The scheduled_sampling section's rules."""
    ss = cfg.scheduled_sampling
    if not 0.0 <= ss.rate <= 1.0:
        raise ConfigError(f"scheduled_sampling.rate must be in [0, 1], got {ss.rate}")
    not_negative({"scheduled_sampling.start": ss.start})
    if ss.steps < 1:
        raise ConfigError(f"scheduled_sampling.steps must be at least 1, got {ss.steps}")


EXTENSION = Extension(
    name="scheduled_sampling", section=ScheduledSamplingConfig, help="scheduled sampling", order=30, kind="objective",
    on=lambda section: bool(section.rate),
    # the first of the objectives that combine: guided attention, after it, wraps it
    install=lambda cfg, model, pad, objective: ScheduledSamplingObjective(cfg.scheduled_sampling, pad),
    validate=validate, combines=True,
    arms={"scheduled sampling": ("scheduled_sampling.rate=0.3", "scheduled_sampling.schedule=constant")},
)
