"""Scheduled sampling for the Transformer, in two decoder passes (Mihaylova & Martins 2019).

Teacher forcing feeds the decoder the gold previous token; at test time it sees its own guesses
(exposure bias). A Transformer decodes every position at once, so the guesses come from a first
pass: teacher-forced, without gradients. Each gold token is then replaced by the first pass's
prediction of it with probability p, and the second pass, on the mixed input, gives the loss.

The mixing happens in label space and is then shifted right: the prediction *for* output i
becomes the input at position i+1, exactly where the gold token i sat. `<s>` and padding stay,
and the masks are the gold tokens' masks. p rises from 0 after `start` along a schedule of the
teacher-forcing probability e(s), s = step - start (Bengio et al. 2015): p = rate * (1 - e(s)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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
