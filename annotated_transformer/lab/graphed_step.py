"""A whole training step recorded by hand as one CUDA graph per batch shape: the GPU check's `graphed` mode.

`train.compile=captured` is torch.compile's reduce-overhead mode, which records the model's forward and
backward; the loss, gradient clipping and the fused Adam step still launch their own kernels. Here
`torch.cuda.CUDAGraph` records all of it, forward, loss, backward, clipping and Adam, so that a step is
one graph launch; the GPU check times both, and whichever is faster is what training should use.

For each new (source, target) shape: a few eager steps on a side stream (a graph needs the allocations
and Adam's state to exist before it records), then one recorded step on static input tensors. After
that a batch of the shape is copied into them and the graph replayed. The learning rate must be a
device tensor (harness.schedules.rate_on_device); Adam is made capturable here (its step checks that
before a graph records it); autocast runs without its weight cache, which a replayed graph would read
stale. The graphs share one memory pool: safe here because each replay rewrites every gradient and
intermediate it reads, the summed loss is copied out after each replay, and the weights and Adam's state
were allocated before any recording. The side stream's steps update the weights: a benchmark's
warm-up, not a training. Off CUDA (`record=False`) the same step on the same static tensors runs
eagerly, which is what the CPU tests compare with `train_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.batch import Batch
from ..loss import SimpleLossCompute


@dataclass
class _Shape:
    """One batch shape's static inputs and, once recorded, its graph and the summed loss it writes."""

    batch: Batch
    norm: Tensor  # 0-dim: the step's token count to divide by
    graph: torch.cuda.CUDAGraph | None = None
    loss: Tensor | None = None


class GraphedStep:
    """`step(batch, norm)` -> the batch's summed loss (a device tensor): one optimizer step, replayed per shape."""

    def __init__(self, model: nn.Module, loss_compute: SimpleLossCompute, optimizer: torch.optim.Optimizer,
                 amp_dtype: torch.dtype | None = None, clip_grad_norm: float = 0.0, record: bool = True,
                 warmup: int = 3) -> None:
        self.model, self.loss_compute, self.optimizer = model, loss_compute, optimizer
        self.amp_dtype, self.clip_grad_norm, self.record, self.warmup = amp_dtype, clip_grad_norm, record, warmup
        self.shapes: dict[tuple[tuple[int, ...], tuple[int, ...]], _Shape] = {}
        self.pool = None  # one memory pool shared by every shape's graph (they never run at once)
        if record:
            for group in optimizer.param_groups:
                group["capturable"] = True  # Adam refuses to be recorded otherwise

    def __call__(self, batch: Batch, norm: float) -> Tensor:
        key = (tuple(batch.src.shape), tuple(batch.tgt.shape))
        shape = self.shapes.get(key) or self._start(key, batch)
        for name in ("src", "tgt", "tgt_y", "src_mask", "tgt_mask"):
            getattr(shape.batch, name).copy_(getattr(batch, name), non_blocking=True)
        shape.norm.fill_(norm)
        if shape.graph is None:
            self.optimizer.zero_grad(set_to_none=True)
            return self._step(shape)
        shape.graph.replay()
        return shape.loss.clone()  # the graph writes the same tensor at its next replay

    def _step(self, shape: _Shape) -> Tensor:
        """Forward, loss, backward, clipping and the optimizer on the shape's static tensors; the summed loss."""
        b, device = shape.batch, shape.batch.src.device
        with torch.autocast(device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None,
                            cache_enabled=False):
            out = self.model(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d)
            loss_sum, loss = self.loss_compute(out, b.tgt_y, shape.norm)
        loss.backward()
        if self.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        return loss_sum

    def _start(self, key: tuple[tuple[int, ...], tuple[int, ...]], batch: Batch) -> _Shape:
        """A new shape: its static tensors (copies of `batch`'s), then, on CUDA, its warm-up and its graph."""
        static = batch.to(batch.src.device)
        for name, value in vars(static).items():
            if isinstance(value, Tensor):
                setattr(static, name, value.clone())
        shape = self.shapes[key] = _Shape(static, torch.ones((), device=batch.src.device))
        if not self.record:
            return shape
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.optimizer.zero_grad(set_to_none=True)
                self._step(shape)
        torch.cuda.current_stream().wait_stream(side)
        self.optimizer.zero_grad(set_to_none=True)  # the recorded backward allocates the gradients it writes
        shape.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(shape.graph, pool=self.pool):
            shape.loss = self._step(shape)
        self.pool = shape.graph.pool()
        return shape
