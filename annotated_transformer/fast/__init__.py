"""Speed, installed from outside on the notebook's classes (as torchtitan's converters are): exact when off.

The model that `make_model` builds, `loss.SimpleLossCompute` and `optim.build_optimizer` are the notebook's.
Training (`extensions.builder.build_training`) and decoding put these on top:

    speed_up(model)                      # every nn.Dropout becomes FastDropout: a cheaper mask on the CPU
    FusedLossCompute(generator, crit)    # LabelSmoothing with the log-softmax fused in (loss.py's value)
    build_optimizer(model, ..., fused=fused_adam_pays(model))   # one fused Adam kernel for all parameters
    with onednn_linears(model): ...      # fp32 decoding through oneDNN where it is faster than MKL (cpu_linear.py)
    compile_model(model, "captured")     # torch.compile, and on GPUs each batch shape's step as CUDA graphs

Beam search lays out its queries for the encoder-decoder attention itself (`decode.query_grid.grouped_queries`).
Left out, each gives the plain path's result: the same values, within float rounding where an operation's
order changes (the fused loss), and the same random draws' distribution (the dropout mask).
Measurements: docs/performance.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.errors import ConfigError
from .cpu_linear import onednn_linears, onednn_pays
from .dropout import FastDropout
from .loss import FusedLossCompute, smoothed_cross_entropy


def speed_up(model: nn.Module) -> nn.Module:
    """Turn `model`'s plain nn.Dropout layers into FastDropout, in place (same state); returns the model."""
    for m in model.modules():
        if type(m) is nn.Dropout:
            m.__class__ = FastDropout
    return model


def slow_down(model: nn.Module) -> nn.Module:
    """Undo `speed_up`: every FastDropout back to PyTorch's nn.Dropout (the notebook's), in place."""
    for m in model.modules():
        if type(m) is FastDropout:
            m.__class__ = nn.Dropout
    return model


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
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ConfigError(f"train.compile=captured replays CUDA graphs, but the model is on {device}: use "
                              "train.compile=true (or false) there")
        return torch.compile(model, mode="reduce-overhead", dynamic=True)
    return torch.compile(model, dynamic=True)


def fused_adam_pays(model: nn.Module) -> bool:
    """Whether Adam's fused kernel applies: every trainable parameter on one CUDA device or on the CPU.

    On a CPU the fused kernel is far faster than the per-tensor loop; on a GPU it saves kernel launches.
    """
    devices = {p.device for p in model.parameters() if p.requires_grad}
    return len(devices) == 1 and next(iter(devices)).type in ("cuda", "cpu")


__all__ = ["FastDropout", "FusedLossCompute", "compile_model", "fused_adam_pays", "onednn_linears", "onednn_pays",
           "slow_down",
           "smoothed_cross_entropy", "speed_up"]
