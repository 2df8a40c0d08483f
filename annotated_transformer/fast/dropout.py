"""nn.Dropout with a cheaper random mask on the CPU (`FastDropout`), installed on a built model by the speed plan.

The model's classes use PyTorch's nn.Dropout, as the notebook does; `plan.speed_up_training` turns each into a
FastDropout in place (same parameters, same state_dict, the same behaviour on every device but the CPU in
training mode). docs/performance.md has the measurements behind it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FastDropout(nn.Dropout):
    """nn.Dropout with a cheaper random mask on the CPU; identical behaviour elsewhere.

    PyTorch's CPU dropout draws one random float per element, which can cost more than the matmul
    around it. Here one random 64-bit integer gives four 16-bit words,
    each uniform over [-2^15, 2^15); an element is kept when its word clears a threshold, so it is
    kept with probability 1 - p to within 2^-16, and the kept ones are scaled by 1 / (1 - p), as
    nn.Dropout does. The mask is made with integer arithmetic (clamping the word to
    [threshold - 1, threshold] leaves 0 or 1) and multiplied in and scaled in one pass each way
    (`_ScaledMask`), cheaper than a boolean mask and `torch.where`. Draws come from torch's global generator, so
    seeded runs (and resumed ones) repeat exactly.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu" or self.p >= 1.0:
            return super().forward(x)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-2**63, None)  # all 64 bits uniform
        words = bits.view(torch.int16)[:n].view(x.shape)  # uniform over [-2^15, 2^15)
        threshold = round(self.p * 65536) - 32768  # a word >= threshold keeps its element
        keep = words.clamp(threshold - 1, threshold).sub_(threshold - 1).to(x.dtype)  # 1 keep, 0 drop
        return _ScaledMask.apply(x, keep, 1.0 / (1.0 - self.p))


class _ScaledMask(torch.autograd.Function):
    """x * keep * scale in one pass each way, the same values as (x * keep) * scale.

    `addcmul` computes scale * x * keep in fp32 and rounds once, as the two-step product does (x * keep
    is exact), and its backward is the same one pass over the gradient; autograd's own backward of
    addcmul would round keep * scale to x's dtype first (1/0.9 is 1.109375 in bf16).
    """

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.addcmul(x.new_zeros(()), x, keep, value=scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return torch.addcmul(grad.new_zeros(()), grad, keep, value=ctx.scale), None, None
