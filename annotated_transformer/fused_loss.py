"""LabelSmoothing on logits with the log-softmax fused in: a speed detail kept out of the teaching path.

`LabelSmoothing.from_logits(logits, target)` equals `forward(log_softmax(logits), target)`. Here the
log-softmax, the divergence and its gradient with respect to the logits (softmax - t, zero on
padding rows) are computed in one sweep over row chunks that stay in cache, in fp32; only the
gradient, in the logits' dtype, is kept for the backward pass. Unfused, autograd keeps an fp32
(N, V) copy of the log-probabilities and makes about six more full passes over (N, V) tensors
(casts, log-softmax backward, the divergence's scatter): a tenth of a base-model CPU step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .loss import LabelSmoothing


def smoothed_cross_entropy(logits: Tensor, target: Tensor, crit: LabelSmoothing) -> Tensor:
    """logits (N, V) in any float dtype, target (N,) -> `crit`'s summed divergence (fp32 scalar), fused."""
    return _SmoothedCrossEntropy.apply(logits, target, crit)


# Rows per chunk of the fused loss on a CPU: about 4 MB of fp32, so a chunk's passes hit the cache.
# On a GPU the whole (N, V) block is one chunk: there, extra kernel launches cost more than memory.
_CPU_CHUNK_ELEMENTS = 1 << 20


class _SmoothedCrossEntropy(torch.autograd.Function):
    """LabelSmoothing on logits, forward and gradient computed together (see `from_logits`)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, crit: LabelSmoothing) -> Tensor:
        N, V = logits.shape
        pad, conf, fill = crit.padding_idx, crit.confidence, crit.fill
        want_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if want_grad else None  # (N, V) d loss / d logits
        loss = logits.new_zeros((), dtype=torch.float32)
        rows = N if logits.device.type != "cpu" else max(1, _CPU_CHUNK_ELEMENTS // V)
        for s in range(0, N, rows):
            t = target[s:s + rows]  # (n,)
            keep = (t != pad).unsqueeze(1)  # (n, 1) padding targets contribute nothing
            logp = logits[s:s + rows].log_softmax(1, dtype=torch.float32)  # (n, V), cast on the fly
            logp_t = logp.gather(1, t.unsqueeze(1))  # (n, 1)
            # sum_j t_j (log t_j - logp_j) in closed form, as in `forward`.
            row = crit.entropy_term - conf * logp_t
            if fill > 0:
                row = row - fill * (logp.sum(1, keepdim=True) - logp[:, pad:pad + 1] - logp_t)
            loss += torch.where(keep, row, 0.0).sum()
            if want_grad:
                # d/dz of -sum_j t_j log softmax(z)_j is softmax(z) - t, since sum_j t_j = 1.
                g = torch.sub(logp.exp_(), fill, out=grad[s:s + rows])  # (n, V) written once, cast on the fly
                if fill > 0:
                    g[:, pad] += fill  # t is 0 in the padding column
                g.scatter_add_(1, t.unsqueeze(1), torch.full_like(logp_t, fill - conf, dtype=g.dtype))
                g.mul_(keep)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_out, None, None  # a new tensor: the saved gradient stays intact for a second backward
