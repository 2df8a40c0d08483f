"""LabelSmoothing on logits with the log-softmax fused in (`FusedLossCompute`): a speed detail kept out of the
teaching path, which computes the same loss with `loss.SimpleLossCompute`.

`smoothed_cross_entropy(logits, target, crit)` equals `crit(log_softmax(logits), target)`. Here the
log-softmax and the divergence are computed in one sweep over row chunks that stay in cache, in
fp32, keeping only each row's log-sum-exp; the backward pass sweeps the logits once more for the
gradient (softmax - t, times the incoming gradient, zero on padding rows), written once in the
logits' dtype. (Made in the forward pass, the gradient would be kept between the passes and need
one more pass over (N, V) to be multiplied by the incoming 1 / tokens.) Unfused, autograd keeps an
fp32 (N, V) copy of the log-probabilities and makes about six more full passes over (N, V) tensors
(casts, log-softmax backward, the divergence's scatter).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ..loss import LabelSmoothing, SimpleLossCompute


class FusedLossCompute(SimpleLossCompute):
    """SimpleLossCompute with the generator's log-softmax fused into LabelSmoothing: the same loss, less time.

    Other criteria (or a generator without `logits`) take SimpleLossCompute's own path.
    """

    def __init__(self, generator, criterion) -> None:
        super().__init__(generator, criterion)
        self.fused = isinstance(criterion, LabelSmoothing) and hasattr(generator, "logits")

    def __call__(self, x: Tensor, y: Tensor, norm: float | Tensor) -> tuple[Tensor, Tensor]:
        """x: decoder output (B, T, d); y: target ids (B, T); norm: the token count to divide by."""
        if not self.fused:
            return super().__call__(x, y, norm)
        logits = self.generator.logits(x)  # (B, T, V)
        loss = self.loss_of_logits(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        return loss.detach(), loss / norm

    def loss_of_logits(self, logits: Tensor, y: Tensor) -> Tensor:
        """The criterion's summed loss on logits (N, V), fused (fp32 scalar)."""
        if not self.fused:
            return super().loss_of_logits(logits, y)
        return smoothed_cross_entropy(logits, y, self.criterion)


def smoothed_cross_entropy(logits: Tensor, target: Tensor, crit: LabelSmoothing) -> Tensor:
    """logits (N, V) in any float dtype, target (N,) -> `crit`'s summed divergence (fp32 scalar), fused."""
    assert logits.size(1) == crit.size, f"expected {crit.size} classes, got {logits.size(1)}"
    return _SmoothedCrossEntropy.apply(logits, target, crit)


# Rows per chunk of the fused loss on a CPU: about 2 MB of fp32, so a chunk's passes stay in the cache.
# On a GPU the whole (N, V) block is one chunk: there, extra kernel launches cost more than memory.
_CPU_CHUNK_ELEMENTS = 1 << 19


def _fp32_chunks(logits: Tensor, target: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
    """(first row, targets (n, 1), the rows' logits in fp32 (n, V)) for each chunk, in one reused fp32 buffer."""
    N, V = logits.shape
    rows = N if logits.device.type != "cpu" else max(1, _CPU_CHUNK_ELEMENTS // V)
    work = logits.new_empty((min(rows, N), V), dtype=torch.float32)
    for s in range(0, N, rows):
        t = target[s:s + rows].unsqueeze(1)  # (n, 1)
        yield s, t, work[:t.size(0)].copy_(logits[s:s + rows])


class _SmoothedCrossEntropy(torch.autograd.Function):
    """LabelSmoothing on logits: the loss and each row's log-sum-exp forward, the gradient backward."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, crit: LabelSmoothing) -> Tensor:
        N, V = logits.shape
        pad, conf, fill = crit.padding_idx, crit.confidence, crit.fill
        lse = logits.new_empty((N, 1), dtype=torch.float32)  # log sum_j exp(logits_j), per row
        loss = logits.new_zeros((), dtype=torch.float32)
        for s, t, z in _fp32_chunks(logits, target):  # t (n, 1), z (n, V)
            top = z.amax(1, keepdim=True)  # (n, 1)
            z.sub_(top)  # so that exp cannot overflow; log-softmax is unchanged
            z_t = z.gather(1, t)  # (n, 1)
            if fill > 0:  # the row sum of log-probabilities, but for padding's, before z is overwritten
                z_rest = z.sum(1, keepdim=True) - z[:, pad:pad + 1]  # (n, 1)
            row_lse = z.exp_().sum(1, keepdim=True).log_()  # (n, 1) log-probabilities are z - row_lse
            torch.add(row_lse, top, out=lse[s:s + t.size(0)])
            logp_t = z_t - row_lse
            # sum_j t_j (log t_j - logp_j) in closed form, as in `forward`.
            row = crit.entropy_term - conf * logp_t
            if fill > 0:
                row = row - fill * (z_rest - (V - 1) * row_lse - logp_t)
            loss += torch.where(t != pad, row, 0.0).sum()  # padding targets contribute nothing
        ctx.save_for_backward(logits, target, lse)
        ctx.crit = crit
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        logits, target, lse = ctx.saved_tensors
        crit = ctx.crit
        pad, conf, fill = crit.padding_idx, crit.confidence, crit.fill
        grad = torch.empty_like(logits)  # (N, V)
        for s, t, z in _fp32_chunks(logits, target):  # t (n, 1), z (n, V)
            e = s + t.size(0)
            k = (t != pad) * grad_out  # (n, 1): the incoming gradient, 0 on padding rows
            # d/dz of -sum_j t_j log softmax(z)_j is softmax(z) - t, since sum_j t_j = 1.
            g = z.sub_(lse[s:e]).exp_().mul_(k)  # (n, V)
            if fill > 0:
                g.sub_(fill * k)
                g[:, pad:pad + 1] += fill * k  # t is 0 in the padding column
            g.scatter_add_(1, t, (fill - conf) * k)  # t is conf in the target's column
            grad[s:e].copy_(g)  # the one write of the chunk, in the logits' dtype
        return grad, None, None
