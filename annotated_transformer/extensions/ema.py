"""An exponential moving average (EMA) of the weights: the model that is validated, saved and translated with.

Polyak averaging in its exponential form: after every optimizer step each parameter's average moves
towards the new weights, avg <- avg + (1 - decay) * (weight - avg), so the average covers about the
last 1 / (1 - decay) steps (1,000 for decay 0.999). Like averaging the last epochs' checkpoints it
smooths the noise of the final steps, but every step counts and no files are needed. Early on the
decay of the n-th update is min(decay, (1 + n) / (10 + n)), so the random initialisation is forgotten
within the first steps instead of weighing on a short run's average.

Training itself never sees the average: it updates the raw weights. The Trainer swaps the average in
(`swapped_in`) to validate, and writes it (`averaged_state_dict`) to the best and epoch_NN model files, so the
checkpoints, the scores and checkpoint averaging are of the average; last.pt keeps the raw weights
and the average to resume.
`build_weight_average` returns None when `ema.decay` is 0, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..runtime.errors import ConfigError
from ..sections import CoreConfig, Extension, param


@dataclass
class EmaConfig:
    """A moving average of the weights (extensions/ema.py), validated and saved in their place; off by default."""

    decay: float = param(0.0, "after every optimizer step avg <- d * avg + (1 - d) * weights, d = min(decay, "
                         "(1 + n) / (10 + n)) at the n-th step; the average is what validation scores and "
                         "the best and epoch_NN model files hold (0: off; 0.999 averages about the last 1,000 steps)")


class WeightAverage:
    """An exponential moving average of a model's parameters, updated by an optimizer step hook."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
        self.average = [p.detach().float().clone() for p in self.params]
        self.updates = 0

    def attach(self, optimizer: torch.optim.Optimizer) -> WeightAverage:
        """Update the average after every `optimizer.step()` (the training loop itself is unchanged)."""
        optimizer.register_step_post_hook(lambda *_: self.update())
        return self

    def current_decay(self) -> float:
        """The decay of the next update: `decay`, or less during the first updates."""
        n = self.updates + 1  # counting this update
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self) -> None:
        """avg <- avg + (1 - decay) * (weight - avg), for every parameter at once."""
        weight = 1.0 - self.current_decay()
        self.updates += 1
        torch._foreach_lerp_(self.average, [p.detach().float() for p in self.params], weight)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Inside: the model's parameters hold the average; after (an exception too): the raw weights, bit for bit."""
        with torch.no_grad():
            raw = [p.detach().clone() for p in self.params]
        try:
            with torch.no_grad():
                for p, a in zip(self.params, self.average):
                    p.copy_(a)
            yield
        finally:
            with torch.no_grad():
                for p, r in zip(self.params, raw):
                    p.copy_(r)

    def averaged_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """`model.state_dict()` with the average in place of each parameter (no copy; tied names share one)."""
        by_param = {id(p): a for p, a in zip(self.params, self.average)}
        return {k: by_param.get(id(v), v).detach() for k, v in model.state_dict(keep_vars=True).items()}

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average afresh from the model's current weights."""
        for mine, p in zip(self.average, self.params):
            mine.copy_(p)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        """The average (in the order of the model's parameters) and the update count, for last.pt."""
        return {"average": list(self.average), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s average; the parameters must match the model's in number and shape."""
        average: list[Tensor] = state["average"]
        if len(average) != len(self.params):
            raise ValueError(f"the saved weight average holds {len(average)} tensors, the model {len(self.params)} "
                             "parameters")
        for i, (a, p) in enumerate(zip(average, self.params)):
            if a.shape != p.shape:
                raise ValueError(f"the saved weight average's tensor {i} has shape {tuple(a.shape)}, the model's "
                                 f"parameter {tuple(p.shape)}")
        for mine, saved in zip(self.average, average):
            mine.copy_(saved)
        self.updates = int(state["updates"])


def build_weight_average(decay: float, model: nn.Module, optimizer: torch.optim.Optimizer) -> WeightAverage | None:
    """The EMA of `model`'s weights, hooked to `optimizer`; None when `decay` is 0 (off)."""
    if not decay:
        return None
    return WeightAverage(model, decay).attach(optimizer)


def validate(cfg: CoreConfig) -> None:
    """The ema section's rule."""
    if not 0 <= cfg.ema.decay < 1:
        raise ConfigError(f"ema.decay must be in [0, 1) (0: off; 0.999 is typical), got {cfg.ema.decay}")


EXTENSION = Extension(
    name="ema", section=EmaConfig, help="a moving average of the weights", order=80, kind="weight average",
    on=lambda section: bool(section.decay),
    install=lambda cfg, model, optimizer: build_weight_average(cfg.ema.decay, model, optimizer),
    validate=validate, arms={"weight average 0.999": ("ema.decay=0.999",)},
)
