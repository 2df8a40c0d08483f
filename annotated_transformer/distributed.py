"""Distributed setup for torchrun (one process = one rank), and rank-0 helpers.

The same code path serves one CPU process, one GPU, and `torchrun --nproc_per_node=N`:
torchrun sets RANK / LOCAL_RANK / WORLD_SIZE (and the rendezvous address), a plain
`python` run has none of them and is rank 0 of 1. Which device a rank uses, and at what
precision, is decided in device.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from . import device as devices
from .errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that logs, writes charts and saves checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one process."""
        return self.world_size > 1


def dist_info_from_env() -> DistInfo:
    """Read torchrun's environment variables (rank 0 of 1 when absent)."""
    try:
        return DistInfo(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                        int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError as exc:
        raise ConfigError(f"bad torchrun environment (RANK/LOCAL_RANK/WORLD_SIZE): {exc}") from None


def init_distributed(device_spec: str = "auto") -> tuple[DistInfo, torch.device]:
    """Pick this rank's device and, under torchrun, join the process group (NCCL on CUDA, gloo otherwise)."""
    info = dist_info_from_env()
    device = devices.select_device(device_spec, info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if info.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30), **kwargs)
    return info, device


def cleanup() -> None:
    """Leave the process group, if any."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """Rank 0, or not distributed at all."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def print0(*args, **kwargs) -> None:
    """print on rank 0 only."""
    if is_main_process():
        print(*args, **kwargs, flush=True)


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (no-op when not distributed); returns it."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def world_size() -> int:
    """Number of processes in the job (1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1
