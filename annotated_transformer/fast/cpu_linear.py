"""fp32 linear layers through oneDNN while decoding on the CPU: a speed detail kept out of the model.

PyTorch sends an fp32 `nn.Linear` on the CPU to Intel MKL's sgemm. On AMD processors MKL takes a
slower code path than oneDNN (PyTorch's other CPU matmul library, the one bf16 autocast already
uses), more so once each weight is reordered into oneDNN's blocked layout (done on its first
product; docs/performance.md has the measurements). `onednn_linears(model)` sends the fp32
linears of `model` through oneDNN for as long as it is open, where that pays: on a non-Intel CPU,
with no gradient and no autocast, and for products of at least `MIN_MACS` multiply-adds (below
that oneDNN's fixed cost per call is larger than MKL's).

A reordered weight is a copy, so it must never outlive a change of its weight. A trainable weight
(`requires_grad`) is reordered again in every block: an optimizer may update it in between without
a trace (fused Adam does not even bump the tensor's version counter), and one reordering per
validation pass costs little. A frozen weight (the Translator freezes its model) keeps its
reordered copy across blocks, made again when the tensor or its version changes (loading weights).
Same weights, same state_dict; the products agree with MKL's to fp32 rounding.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Multiply-adds from which oneDNN was measured faster than MKL on an AMD CPU (below, its fixed cost per call wins).
MIN_MACS = 1 << 20

# The batch size oneDNN is told to reorder a weight for; the reordered weight serves any number of rows.
PACK_ROWS = 128

# "1" or "0" forces the choice (benchmarks compare both in one process); unset: `onednn_pays()`.
ENV = "ANNOTATED_TRANSFORMER_ONEDNN_LINEAR"


@lru_cache(maxsize=1)
def _cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear operator (every x86 build since 2.0 does)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def onednn_pays() -> bool:
    """Whether decoding sends fp32 linears through oneDNN here: on non-Intel x86 CPUs, or as ENV says.

    On Intel CPUs MKL's sgemm is Intel's own best path and was not measured slower, so it stays.
    """
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1" and onednn_available()
    return onednn_available() and _cpu_vendor() not in ("GenuineIntel", "unknown")


# layer -> ((weight's address, its version), the weight in oneDNN's layout). Weak, so a model that goes away takes
# its copies with it, and off the module, so copying, quantising or saving a model never meets them.
_reordered: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int], Tensor]] = weakref.WeakKeyDictionary()


def reordered_weight(layer: nn.Linear) -> Tensor:
    """`layer.weight` in oneDNN's blocked layout: the copy kept for it, or a new one if the weight moved or changed."""
    key = (layer.weight.data_ptr(), layer.weight._version)
    kept = _reordered.get(layer)
    if kept is None or kept[0] != key:
        kept = (key, torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), PACK_ROWS))
        _reordered[layer] = kept
    return kept[1]


class OneDNNLinear(nn.Linear):
    """nn.Linear whose fp32 inference on the CPU runs in oneDNN for products of MIN_MACS or more."""

    def forward(self, x: Tensor) -> Tensor:
        if (x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled()
                or torch.is_autocast_enabled("cpu") or x.numel() * self.out_features < MIN_MACS):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, reordered_weight(self), self.bias, "none", [], "")


@contextmanager
def onednn_linears(model: nn.Module, enabled: bool | None = None) -> Iterator[None]:
    """Inside the block, `model`'s plain nn.Linear layers are OneDNNLinear (see the module docstring).

    `enabled=None` asks `onednn_pays()`. The layers' class is swapped in place and swapped back
    on leaving, so the same module objects (and their weights) serve inside and outside. On leaving,
    the reordered copies of trainable weights are dropped (see the module docstring).
    """
    if enabled is None:
        enabled = onednn_pays()
    swapped = [m for m in model.modules() if type(m) is nn.Linear] if enabled else []
    for m in swapped:
        m.__class__ = OneDNNLinear
    try:
        yield
    finally:
        for m in swapped:
            m.__class__ = nn.Linear
            if m.weight.requires_grad:
                _reordered.pop(m, None)
