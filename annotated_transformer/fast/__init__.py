"""Speed, installed from outside on the notebook's classes (as torchtitan's converters are): exact when off.

The model that `make_model` builds, `loss.SimpleLossCompute` and `optim.build_optimizer` are the notebook's.
plan.py installs everything here on them, in two functions, each called in one place:

    step_model, loss_compute, optimizer = speed_up_training(model, loss_compute, optimizer, fast=train.fast,
        attention_kernel=model.attention_kernel, compile=train.compile)     # extensions/builder.build_training
    with speed_up_decoding(model, device, fast=..., attention_kernel=...):  # decode/inference.translate_ids
        ...

What they install: FastDropout (dropout.py, a cheaper mask on the CPU), FusedAttention (attention.py, PyTorch's
fused attention kernel), FusedLossCompute (loss.py, the log-softmax fused into LabelSmoothing), Adam's fused
kernel, torch.compile, and OneDNNLinear while decoding (cpu_linear.py). Beam search lays out its queries for the
encoder-decoder attention itself (`decode.query_grid.grouped_queries`). Left out (`train.fast=false`), each
gives the plain path's result: the same values, within float rounding where an operation's order changes (the
fused loss, the fused kernels), and the same random draws' distribution (the dropout mask).
Measurements: docs/performance.md.
"""

from __future__ import annotations

from .attention import FusedAttention
from .cpu_linear import onednn_linears, onednn_pays
from .dropout import FastDropout
from .loss import FusedLossCompute, smoothed_cross_entropy
from .plan import (compile_model, fused_adam, fused_adam_pays, fused_attention_pays, speed_up_decoding,
                   speed_up_training, swap_class)

__all__ = ["FastDropout", "FusedAttention", "FusedLossCompute", "compile_model", "fused_adam", "fused_adam_pays",
           "fused_attention_pays", "onednn_linears", "onednn_pays", "smoothed_cross_entropy", "speed_up_decoding",
           "speed_up_training", "swap_class"]
