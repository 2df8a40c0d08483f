"""Device choice: a GPU that NVML sees but torch cannot use is named (a warning with 'auto', a one-line
error with 'cuda'); no GPU at all stays quiet. NVML and torch.cuda are faked, so this runs on any CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from annotated_transformer.runtime import device as devices
from annotated_transformer.runtime.device import configure_backends, select_device, unusable_gpu
from annotated_transformer.runtime.errors import ConfigError, run_cli

A100 = "NVIDIA A100-SXM4-80GB"


def fake_nvml(names=(A100,), driver="535.104.05", cuda_driver: int | None = 12020, fail_at: str = ""):
    """A stand-in for nvidia-ml-py's `pynvml` module; `fail_at` names the call that raises."""
    nvml = types.ModuleType("pynvml")

    def call(name, result):
        def f(*_):
            if name == fail_at:
                raise RuntimeError(f"{name} failed")
            return result(*_) if callable(result) else result
        return f

    nvml.nvmlInit = call("nvmlInit", None)
    nvml.nvmlShutdown = call("nvmlShutdown", None)
    nvml.nvmlDeviceGetCount = call("nvmlDeviceGetCount", len(names))
    nvml.nvmlDeviceGetHandleByIndex = call("nvmlDeviceGetHandleByIndex", lambda i: i)
    nvml.nvmlDeviceGetName = call("nvmlDeviceGetName", lambda i: names[i])
    nvml.nvmlSystemGetDriverVersion = call("nvmlSystemGetDriverVersion", driver)
    if cuda_driver is not None:
        nvml.nvmlSystemGetCudaDriverVersion = call("nvmlSystemGetCudaDriverVersion", cuda_driver)
    return nvml


@pytest.fixture
def torch_without_cuda(monkeypatch):
    """torch 2.15.0+cu132 that cannot start CUDA (and no MPS), the warning not yet printed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.2")
    monkeypatch.setattr(torch, "__version__", "2.15.0+cu132")
    monkeypatch.setattr(devices, "_warned", False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def nvml(monkeypatch, torch_without_cuda):
    """Install a fake pynvml: nvml(**kwargs) as in fake_nvml, or nvml(None) for no nvidia-ml-py at all."""
    def install(module=..., **kwargs):
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(**kwargs) if module is ... else module)
    return install


def test_auto_names_an_unusable_gpu_once_and_falls_back_to_the_cpu(nvml, capsys):
    nvml()
    assert select_device("auto") == torch.device("cpu")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), err
    for fact in (A100, "driver 535.104.05", "supports CUDA 12.2", "torch 2.15.0+cu132", "built for CUDA 13.2",
                 "580 series", "running on the CPU", "CUDA 12.x", "docs/gpu.md"):
        assert fact in lines[0], (fact, lines[0])
    select_device("auto")  # once per process
    assert capsys.readouterr().err == ""


def test_only_local_rank_0_warns(nvml, capsys):
    nvml()
    assert select_device("auto", local_rank=3) == torch.device("cpu")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_an_explicit_cuda_device_is_a_config_error_naming_the_facts(nvml, spec):
    nvml(names=(A100, A100))
    with pytest.raises(ConfigError) as info:
        select_device(spec)
    message = str(info.value)
    assert "\n" not in message
    for fact in (f"train.device is '{spec}'", f"2x {A100}", "driver 535.104.05", "CUDA 13.2", "580 series",
                 "train.device=cpu"):
        assert fact in message, (fact, message)


def test_the_cli_exits_2_with_one_error_line(nvml, capsys):
    nvml()
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: select_device("cuda").index)
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.device is 'cuda' but torch"), lines
    assert A100 in lines[0] and "535.104.05" in lines[0]


def test_a_cpu_only_torch_build_is_named(nvml, monkeypatch):
    nvml(driver="580.95.05", cuda_driver=13000)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch, "__version__", "2.15.0+cpu")
    problem, fix = unusable_gpu()
    assert "torch 2.15.0+cpu" in problem and "a CPU-only torch build" in problem and "580.95.05" in problem
    assert "install a CUDA build of torch" in fix


def test_older_nvml_bindings_bytes_names_and_no_cuda_version(nvml):
    # Without nvmlSystemGetCudaDriverVersion the driver branch decides: 570 is too old for CUDA 13.
    nvml(names=(b"Tesla V100-SXM2-32GB",), driver=b"570.86.10", cuda_driver=None)
    problem, _ = unusable_gpu()
    assert "Tesla V100-SXM2-32GB" in problem and "driver 570.86.10" in problem and "580 series" in problem
    assert "b'" not in problem


def test_a_recent_driver_points_at_cuda_visible_devices_or_torchs_own_warning(nvml, monkeypatch):
    nvml(driver="580.95.05", cuda_driver=13000)
    problem, _ = unusable_gpu()
    assert "did not start although the driver is recent enough" in problem
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    problem, fix = unusable_gpu()
    assert "CUDA_VISIBLE_DEVICES=''" in problem and "unset CUDA_VISIBLE_DEVICES" in fix


@pytest.mark.parametrize("case", ["no nvidia-ml-py", "no driver", "no device", "a failing call"])
def test_no_gpu_seen_is_quiet(nvml, capsys, case):
    if case == "no nvidia-ml-py":
        nvml(None)  # `import pynvml` raises ImportError
    elif case == "no driver":
        nvml(fail_at="nvmlInit")
    elif case == "no device":
        nvml(names=())
    else:
        nvml(fail_at="nvmlDeviceGetName")
    assert select_device("auto") == torch.device("cpu")
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="CUDA is not available here .no NVIDIA GPU found.; use train.device=cpu"):
        select_device("cuda")
    with pytest.raises(ConfigError, match="^device is 'cuda' but CUDA .*; use cpu or auto$"):
        select_device("cuda", option="device")  # the API's device= and a command's --device alike


def test_the_option_is_named_in_errors():
    with pytest.raises(ConfigError, match="^device 'gpu' is not a torch device"):
        select_device("gpu", option="device")


@pytest.mark.parametrize(("capability", "dtype"), [((7, 0), None), ((7, 5), None), ((8, 0), torch.bfloat16)])
def test_precision_auto_is_fp32_on_gpus_that_only_emulate_bf16(monkeypatch, capability, dtype):
    # torch.cuda.is_bf16_supported() is true on a V100 or T4 too, where bf16 is emulated and slow.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    gpu = torch.device("cuda", 0)
    assert devices.resolve_amp_dtype("auto", gpu) == dtype
    assert devices.resolve_amp_dtype("fp32", gpu) is None
    assert devices.resolve_amp_dtype("bf16", gpu) == torch.bfloat16


@pytest.mark.parametrize(("cap", "bf16_flags", "native"), [
    ("", True, True), ("", False, False), ("AVX2", True, False), ("avx512_core", True, False),
    ("AVX512_CORE_BF16", True, True), ("AVX512_CORE_AMX", True, True), ("AVX512_CORE_BF16", False, False)])
def test_cpu_bf16_is_native_only_where_the_cpu_has_it_and_onednn_may_use_it(monkeypatch, cap, bf16_flags, native):
    # An AVX2 cap makes oneDNN emulate bf16 (about 14x slower steps than AMX), so 'auto' must pick fp32 there.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_flags)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    cpu = torch.device("cpu")
    assert devices.native_bf16(cpu) is native
    assert devices.resolve_amp_dtype("auto", cpu) == (torch.bfloat16 if native else None)


def test_a_cuda_device_turns_off_cudnn_attention():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        configure_backends(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        configure_backends(torch.device("cuda"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_choosing_the_cpu_enlarges_onednns_kernel_cache_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv(devices.ONEDNN_CACHE_ENV, raising=False)
    assert select_device("cpu") == torch.device("cpu")
    assert os.environ[devices.ONEDNN_CACHE_ENV] == str(devices.ONEDNN_CACHE_CAPACITY)
    assert devices.ONEDNN_CACHE_CAPACITY > 1024  # oneDNN's own default, too small for bucketed batches
    monkeypatch.setenv(devices.ONEDNN_CACHE_ENV, "300")
    configure_backends(torch.device("cpu"))
    assert os.environ[devices.ONEDNN_CACHE_ENV] == "300"


FAULTS_OF_LARGE_TENSORS = """
import ctypes, resource, torch
from annotated_transformer.runtime.device import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, keep_freed_memory

# glibc's documented defaults, fixed: its own raises them as it goes, so what it faults varies from run to run
ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 128 * 1024)
ctypes.CDLL(None).mallopt(M_TRIM_THRESHOLD, 128 * 1024)

def faults():  # minor page faults while 80 MB of tensors come and go, as decoding steps' do
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        xs = [torch.ones(2_500_000) for _ in range(8)]
        del xs
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()
default = faults()
assert keep_freed_memory()
faults()
print(default, faults())
"""


@pytest.mark.slow  # a fresh Python process: 3.5 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc setting; other systems keep theirs")
def test_keeping_freed_memory_stops_the_page_faults_unless_the_user_configured_malloc(monkeypatch):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_LARGE_TENSORS], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    default, kept = int(out[0]), int(out[1])
    assert default > 20_000  # glibc hands the freed heap back and faults it in again: a fault per 4 KB page
    assert kept < default // 100
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert not devices.keep_freed_memory()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert not devices.keep_freed_memory()


def test_a_translator_keeps_freed_memory_on_the_cpu_only(monkeypatch):
    from annotated_transformer import make_model
    from annotated_transformer.deploy import translator

    calls: list[str] = []
    monkeypatch.setattr(translator, "keep_freed_memory", lambda: calls.append("kept"))
    tr = translator.Translator(make_model(10, 10, N=1, d_model=16, d_ff=32, h=2), None, None, "cpu")
    assert calls == ["kept"]
    monkeypatch.setattr(translator, "configure_backends", lambda device: None)  # no CUDA calls here
    monkeypatch.setattr(tr.model, "to", lambda device: tr.model)
    tr.to("meta")
    assert calls == ["kept"]


# ---------------------------------------------------------------- the commands, as a user runs them (in this process)


def error_line_of(capsys, command: str, *args: str) -> str:
    """Run `command` as scripts/<command>.py does; it must exit 2 with one `error:` line, which is returned."""
    from annotated_transformer.cli import run

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run(command, list(args), f"{command}.py")
    assert done.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine can use CUDA")


@needs_no_cuda
def test_train_device_cuda_without_cuda_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    line = error_line_of(capsys, "train", "--config", "copy", "train.device=cuda", f"train.out_dir={tmp_path / 'run'}")
    assert line.startswith("error: train.device is 'cuda' but ")
    assert not (tmp_path / "run").exists()


@needs_no_cuda
def test_train_device_cuda_names_the_gpu_nvml_sees(tmp_path, capsys, nvml):
    nvml()
    line = error_line_of(capsys, "train", "--config", "copy", "train.device=cuda", f"train.out_dir={tmp_path / 'run'}")
    assert line.startswith("error: train.device is 'cuda' but torch ")
    assert A100 in line and "driver 535.104.05" in line and "torch 2.15.0+cu132" in line


@needs_no_cuda
def test_translate_chooses_its_device_the_same_way(tmp_path, capsys, nvml):
    nvml()
    source = tmp_path / "de.txt"
    source.write_text("Ein Mann.\n")
    line = error_line_of(capsys, "translate", "--checkpoint", str(tmp_path / "missing.pt"), "--input", str(source),
                         "--device", "cuda")
    assert line.startswith("error: device is 'cuda' but torch ") and A100 in line
