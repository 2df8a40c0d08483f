"""The speed plan: every speed change of fast/, installed from outside on the notebook's objects, as torchtitan
applies its model converters. One function for training, called once, on the built model, loss and optimizer
(extensions/builder.build_training); one for decoding, around every batched decode (decode/inference.translate_ids,
through which training's validation, the Translator and the charts decode):

    speed_up_training                               speed_up_decoding (for as long as it is open)
    nn.Dropout -> FastDropout (the CPU mask)        MultiHeadedAttention -> FusedAttention, where it pays
    MultiHeadedAttention -> FusedAttention,         nn.Linear -> OneDNNLinear (fp32 on non-Intel CPUs)
      where it pays (model.attention_kernel)
    SimpleLossCompute -> FusedLossCompute
    Adam -> the same Adam with fused=True
    torch.compile as train.compile says

Each swap changes a module's class in place to a subclass: the same parameters, state_dict and hooks, so the
initial weights are the notebook's. With `fast=False` (train.fast=false) both give back what they were given:
the notebook's exact path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..attention import MultiHeadedAttention
from ..loss import SimpleLossCompute
from ..runtime.errors import ConfigError
from .attention import FusedAttention
from .cpu_linear import onednn_linears
from .dropout import FastDropout
from .loss import FusedLossCompute


def swap_class(model: nn.Module, old: type[nn.Module], new: type[nn.Module]) -> list[nn.Module]:
    """Every module of `model` whose class is exactly `old` becomes a `new` (a subclass adding no state), in place;
    returns the modules changed (set their `__class__` back to `old` to undo)."""
    changed = [m for m in model.modules() if type(m) is old]
    for m in changed:
        m.__class__ = new
    return changed


def fused_attention_pays(attention_kernel: str, device: torch.device) -> bool:
    """model.attention_kernel's rule: 'fused' always, 'explicit' never, 'auto' off the CPU (where the explicit
    product was measured faster)."""
    return attention_kernel == "fused" or (attention_kernel == "auto" and device.type != "cpu")


def fused_adam_pays(model: nn.Module) -> bool:
    """Whether Adam's fused kernel applies: every trainable parameter on one CUDA device or on the CPU.

    On a CPU the fused kernel is far faster than the per-tensor loop; on a GPU it saves kernel launches.
    """
    devices = {p.device for p in model.parameters() if p.requires_grad}
    return len(devices) == 1 and next(iter(devices)).type in ("cuda", "cpu")


def fused_adam(optimizer: torch.optim.Adam) -> torch.optim.Adam:
    """The same Adam (its parameter groups and settings) with PyTorch's one-kernel step; before its first step."""
    if optimizer.state:
        raise ValueError("fused_adam rebuilds an optimizer that has not stepped yet; this one has state")
    groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")} for g in optimizer.param_groups]
    return torch.optim.Adam(groups, **{**optimizer.defaults, "fused": True, "foreach": None})


def check_compile_mode(mode: bool | str, device: torch.device) -> None:
    """One line when train.compile cannot work on `device` (captured CUDA graphs on anything but a CUDA GPU)."""
    if mode == "captured" and device.type != "cuda":
        raise ConfigError(f"train.compile=captured replays CUDA graphs, but the model is on {device}: use "
                          "train.compile=true (or false) there")


def compile_model(model: nn.Module, mode: bool | str) -> nn.Module:
    """`model` as train.compile says: itself (False), compiled (True), or compiled with its steps captured.

    One compile with symbolic shapes serves every batch shape. 'captured' is torch.compile's
    reduce-overhead mode: each new batch shape's forward and backward are recorded once as CUDA graphs
    and replayed, so a step costs a few graph launches instead of hundreds of kernel launches; it pays
    with a few fixed batch shapes (data.static_shapes) and needs a CUDA device.
    """
    if mode is False:
        return model
    if mode == "captured":
        check_compile_mode(mode, next(model.parameters()).device)
        return torch.compile(model, mode="reduce-overhead", dynamic=True)
    return torch.compile(model, dynamic=True)


def speed_up_training(model: nn.Module, loss_compute: SimpleLossCompute, optimizer: torch.optim.Optimizer, *,
                      fast: bool = True, attention_kernel: str = "auto", compile: bool | str = False
                      ) -> tuple[nn.Module, SimpleLossCompute, torch.optim.Optimizer]:
    """Every training speed change on the model (on its device), its loss and its optimizer (not stepped yet).

    Returns the module the training step calls (`model`, or compiled), the loss and the optimizer to use;
    `model` itself is changed in place. `fast=False`: all three as given, the notebook's exact path.
    """
    if not fast:
        return model, loss_compute, optimizer
    swap_class(model, nn.Dropout, FastDropout)
    if fused_attention_pays(attention_kernel, next(model.parameters()).device):
        swap_class(model, MultiHeadedAttention, FusedAttention)
    if type(loss_compute) is SimpleLossCompute:
        loss_compute = FusedLossCompute(loss_compute.generator, loss_compute.criterion)
    if type(optimizer) is torch.optim.Adam and not optimizer.defaults["fused"] and fused_adam_pays(model):
        optimizer = fused_adam(optimizer)
    return compile_model(model, compile), loss_compute, optimizer


@contextmanager
def speed_up_decoding(model: nn.Module, device: torch.device, *, fast: bool = True,
                      attention_kernel: str = "auto") -> Iterator[None]:
    """Inside the block, `model` decodes on `device` with the speed that pays there: the fused attention kernel
    (model.attention_kernel) and, on the CPU, oneDNN's fp32 linears (cpu_linear.py); swapped back on leaving,
    also after an error. `fast=False`: the model as it is."""
    fused = swap_class(model, MultiHeadedAttention, FusedAttention) if (
        fast and fused_attention_pays(attention_kernel, device)) else []
    try:
        with onednn_linears(model, enabled=None if fast and device.type == "cpu" else False):
            yield
    finally:
        for m in fused:
            m.__class__ = MultiHeadedAttention
