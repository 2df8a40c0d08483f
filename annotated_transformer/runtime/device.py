"""Which device a run uses, at what precision, and with which kernels.

`select_device` serves training, translation, evaluation and the benchmark alike. When it
falls back from CUDA, it asks NVML (nvidia-ml-py) whether the machine has NVIDIA GPUs that torch
cannot use, the usual cause being a driver older than the CUDA build of torch needs, and says so
once instead of quietly training on the CPU; an explicit `cuda` device stops with the same facts.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections import Counter
from pathlib import Path

import torch

from .errors import ConfigError

# The oldest driver branch that runs any build of a CUDA major version (CUDA's minor version
# compatibility: every 12.x build runs on a 525 driver, every 13.x build on a 580 driver).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
GPU_SETUP = 'docs/gpu.md'

_warned = False  # the NVML check runs once per process

# oneDNN, which runs PyTorch's bf16 matrix products on the CPU, compiles a kernel for every new
# shape and keeps the most recently used ones, 1,024 by default. Bucketed batches need more: an
# epoch brings a hundred or more (batch, source, target) shapes, each with its own products forward
# and backward, so with the default every step compiled its kernels again, which costs more than
# running them. Read by oneDNN when it makes its first kernel; a value the user sets wins.
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 16384

# glibc's malloc gives a large block (128 KB up, a bound it raises as it sees large blocks
# freed) its own mapping, unmapped when freed, and returns free memory at the top of its heap to
# the system beyond a trim threshold. Decoding makes and drops tensors of many MB every step (beam
# search's logits: 640 hypotheses x 8,000 pieces, 20 MB), so each came back from the system and
# was faulted in page by page again, which took longer than a log-softmax over it. Keeping freed
# blocks up to 32 MB (glibc's largest mapping threshold) in the heap made beam search faster
# (docs/performance.md); training steps measured no gain, so only the Translator sets it. The cost: the process
# keeps its peak heap
# instead of shrinking after it. Settings the user gives glibc win.
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 1 << 30
MALLOC_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's option numbers, from glibc's malloc.h


def configure_backends(device: torch.device) -> None:
    """Process-wide kernel choices for `device`; called wherever a device is chosen.

    On CUDA, scaled_dot_product_attention may pick cuDNN's fused attention first (recent PyTorch).
    cuDNN builds an execution plan for every new (batch, length) shape, and here nearly every batch
    and every decoding step has a new shape, which made steps several times slower on a GPU
    (docs/performance.md). The memory-efficient and flash kernels need no plan, so cuDNN's is off.

    On the CPU, oneDNN's cache of compiled kernels is enlarged (see ONEDNN_CACHE_CAPACITY) for the
    same reason: bucketed batches and decoding steps bring many shapes.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    elif device.type == "cpu":
        os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MB for reuse, for decoding (see MALLOC_MMAP_THRESHOLD).

    True when set; False where malloc is not glibc's or the user configured it through the environment.
    """
    user_set = any(name in os.environ for name in MALLOC_USER_SETTINGS)
    if not sys.platform.startswith("linux") or user_set or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl and other C libraries: their own allocator, left as it is
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                   MALLOC_TRIM_THRESHOLD))


def select_device(spec: str = "auto", local_rank: int = 0, option: str = "train.device") -> torch.device:
    """'auto' picks cuda:<local_rank>, else mps, else cpu; anything else is taken as a torch device.

    `option` names the setting in error messages (`train.device`, or `device` for the Translator).
    """
    device = _select_device(spec, local_rank, option)
    configure_backends(device)
    return device


def _setting(option: str, value: str) -> str:
    """How to set `option` to `value` in a message: an override (train.device=cpu); a --flag or a Python keyword
    (the device a command's --device and the API's device= both name): the value alone."""
    return f"{option}={value}" if "." in option else value


def _select_device(spec: str, local_rank: int, option: str) -> torch.device:
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if local_rank == 0:  # one line per machine under torchrun, not one per rank
            _warn_unusable_gpu()
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"{option} '{spec}' is not a torch device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            found = unusable_gpu()
            if found is None:
                raise ConfigError(f"{option} is '{spec}' but CUDA is not available here (no NVIDIA GPU found); "
                                  f"use {_setting(option, 'cpu')} or auto")
            problem, fix = found
            raise ConfigError(f"{option} is '{spec}' but {problem}. Fix: {fix}, or use {_setting(option, 'cpu')}")
        if device.index is None:
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError(f"{option} is 'mps' but MPS is not available here; use {_setting(option, 'cpu')} or auto")
    return device


def _warn_unusable_gpu() -> None:
    """Print, once per process, why the NVIDIA GPUs NVML sees are not used (nothing when it sees none)."""
    global _warned
    if _warned:
        return
    _warned = True
    found = unusable_gpu()
    if found is not None:
        problem, fix = found
        print(f"warning: {problem}; running on the CPU instead. Fix: {fix}.", file=sys.stderr, flush=True)


def unusable_gpu() -> tuple[str, str] | None:
    """(problem, fix) when NVML sees NVIDIA GPUs that torch cannot use; None when it sees none or torch can.

    The problem names the GPUs, the driver, torch's version and CUDA build and the likely cause.
    """
    if torch.cuda.is_available():
        return None
    seen = nvml_gpus()
    if seen is None:
        return None
    names, driver, driver_cuda = seen
    counts = Counter(names)
    gpus = ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.items())
    facts = f"driver {driver}" + (f", which supports CUDA {driver_cuda} at most" if driver_cuda else "")
    noun = "GPU" if len(names) == 1 else "GPUs"
    problem = f"torch {torch.__version__} cannot use the NVIDIA {noun} NVML sees ({gpus}; {facts})"
    cuda = torch.version.cuda
    if cuda is None:
        return (f"{problem}: it is a CPU-only torch build",
                f"install a CUDA build of torch (see {GPU_SETUP})")
    major = _major(cuda)
    if _driver_too_old(major, driver, driver_cuda):
        needed = f"of the {MIN_DRIVER[major]} series or newer" if major in MIN_DRIVER else f"for CUDA {major}"
        older = f"CUDA {_major(driver_cuda)}.x" if driver_cuda else "an older CUDA"
        return (f"{problem}: it is built for CUDA {cuda}, which needs a driver {needed}",
                f"update the NVIDIA driver, or install a torch build for {older} (see {GPU_SETUP})")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None:
        return (f"{problem}: CUDA_VISIBLE_DEVICES={hidden!r} hides the {noun} from this torch (built for CUDA {cuda})",
                "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use in it")
    return (f"{problem}: its CUDA {cuda} build did not start although the driver is recent enough "
            "(torch's own warning says why; in a container, check that it was given the GPUs)",
            f"check that nvidia-smi works and run the one-line check in {GPU_SETUP}")


def nvml_gpus() -> tuple[list[str], str, str | None] | None:
    """(GPU names, driver version, newest CUDA version the driver supports) from NVML; None when it sees none.

    Never raises: no nvidia-ml-py, no driver, no device or any NVML error all mean "no GPU seen".
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count < 1:
            return None
        names = [_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            version = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12020 for CUDA 12.2
            driver_cuda = f"{version // 1000}.{version % 1000 // 10}"
        except Exception:
            driver_cuda = None
        return names, driver, driver_cuda
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: str | bytes) -> str:
    """NVML strings are bytes in older nvidia-ml-py releases."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _major(version: str | None) -> int | None:
    """The leading integer of '13.2' or '535.104.05' (None when there is none)."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _driver_too_old(cuda_major: int | None, driver: str, driver_cuda: str | None) -> bool:
    """Whether the driver cannot run torch's CUDA major version (by NVML's CUDA version, else the branch)."""
    if cuda_major is None:
        return False
    if driver_cuda is not None and _major(driver_cuda) is not None:
        return _major(driver_cuda) < cuda_major
    branch = _major(driver)
    return branch is not None and cuda_major in MIN_DRIVER and branch < MIN_DRIVER[cuda_major]


# ONEDNN_MAX_CPU_ISA values below AVX512_CORE_BF16: under such a cap oneDNN, which runs PyTorch's bf16
# products on the CPU, emulates bf16 with slow conversions, so bf16 is not native there.
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls run natively (and so faster than fp32) on this device.

    CUDA GPUs from Ampere on (compute capability 8.0; `torch.cuda.is_bf16_supported()` is also true
    where bf16 is only emulated, slower than fp32: V100, T4, RTX 20xx) and ROCm GPUs; CPUs with
    AVX512-BF16 or AMX, unless ONEDNN_MAX_CPU_ISA caps oneDNN below AVX512_CORE_BF16 (which is also
    how the tests run an AVX2-only CPU's path on a newer one).
    """
    if device.type == "cuda":
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "cpu":
        if os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper() in _ONEDNN_ISAS_WITHOUT_BF16:
            return False
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_amp_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """'auto': bf16 autocast where the hardware runs bf16 natively, fp32 elsewhere; 'bf16'; 'fp32' (None)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("train.precision=bf16 but this GPU has no bf16 support; use train.precision=fp32")
        return torch.bfloat16
    return torch.bfloat16 if native_bf16(device) else None


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock times mean something."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_info(field: str) -> str | None:
    """The first value of `field` ('model name', 'flags', ...) in /proc/cpuinfo; None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def device_name(device: torch.device) -> str:
    """A human-readable name of the machine: the GPU and CUDA version, or the CPU model and torch's threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    model = cpu_info("model name") or platform.processor() or "CPU"
    return f"{model}, {torch.get_num_threads()} threads"
