"""train.malloc: a CPU training process restarts itself under tcmalloc where the machine has it (harness.malloc)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer.cli import run
from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.config import load_config
from annotated_transformer.harness import malloc
from annotated_transformer.harness.malloc import (RESTARTED_ENV, library_to_preload, malloc_in_use, restart_with,
                                                  runs_on_cpu)
from annotated_transformer.lab.hardware import in_fresh_process

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")


def without_the_suites_setting() -> dict[str, str]:
    """This process's environment without conftest's ANNOTATED_TRANSFORMER_MALLOC=system: a train command restarts."""
    return {k: v for k, v in os.environ.items() if k != RESTARTED_ENV}


@pytest.fixture
def tcmalloc_dir(tmp_path) -> Path:
    """A library folder holding a file named as gperftools' minimal tcmalloc."""
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    return tmp_path


@linux_only
def test_auto_preloads_tcmalloc_for_a_cpu_run_where_the_machine_has_it(tcmalloc_dir, tmp_path):
    found = tcmalloc_dir / "libtcmalloc_minimal.so.4"
    assert library_to_preload("auto", "cpu", {}, [tmp_path / "nothing", tcmalloc_dir]) == found
    assert library_to_preload("tcmalloc", "cpu", {}, [tcmalloc_dir]) == found
    # the restarted process, a GPU run, the user's own preload and 'system' all go on as they are
    assert library_to_preload("auto", "cpu", {RESTARTED_ENV: str(found)}, [tcmalloc_dir]) is None
    assert library_to_preload("auto", "cuda:0", {}, [tcmalloc_dir]) is None
    assert library_to_preload("auto", "cpu", {"LD_PRELOAD": "/opt/libjemalloc.so.2"}, [tcmalloc_dir]) is None
    assert library_to_preload("system", "cpu", {}, [tcmalloc_dir]) is None
    assert library_to_preload("auto", "cpu", {}, [tmp_path / "nothing"]) is None  # none installed: glibc's


@linux_only
def test_a_named_library_is_preloaded_or_refused_in_one_line(tcmalloc_dir, tmp_path):
    lib = tcmalloc_dir / "libtcmalloc_minimal.so.4"
    assert library_to_preload(str(lib), "cuda", {}, []) == lib.resolve()  # asked for: on any device
    with pytest.raises(ConfigError, match="apt install libtcmalloc-minimal4"):
        library_to_preload("tcmalloc", "cpu", {}, [tmp_path / "nothing"])
    with pytest.raises(ConfigError, match="no such file"):
        library_to_preload(str(tmp_path / "libmissing.so"), "cpu", {}, [])
    with pytest.raises(ConfigError, match="pip install cmeel-mimalloc"):
        library_to_preload("mimalloc", "cpu", {}, [tmp_path / "nothing"])
    with pytest.raises(ConfigError, match="must be auto, system, tcmalloc, mimalloc or the path"):  # the config
        load_config("copy.yaml", ["train.malloc=jemalloc"])


def test_which_runs_are_on_the_cpu(tmp_path, monkeypatch):
    assert runs_on_cpu("cpu") and runs_on_cpu("cpu:0")
    assert not runs_on_cpu("cuda") and not runs_on_cpu("cuda:1") and not runs_on_cpu("mps")
    driver = tmp_path / "nvidiactl"
    driver.write_bytes(b"")
    monkeypatch.setattr(malloc, "GPU_DEVICE_FILES", (str(driver),))  # a machine with a GPU driver
    assert not runs_on_cpu("auto", {})
    assert runs_on_cpu("auto", {"CUDA_VISIBLE_DEVICES": ""}) and runs_on_cpu("auto", {"CUDA_VISIBLE_DEVICES": "-1"})
    monkeypatch.setattr(malloc, "GPU_DEVICE_FILES", (str(tmp_path / "none"),))
    assert runs_on_cpu("auto", {})


def test_a_restart_that_fails_is_a_note_and_the_process_goes_on(tcmalloc_dir, monkeypatch, capsys):
    def refuse(*args):
        raise PermissionError("not allowed")

    monkeypatch.setattr(malloc.os, "execve", refuse)
    restart_with(tcmalloc_dir / "libtcmalloc_minimal.so.4")  # returns instead of replacing the process
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: could not restart") and "not allowed" in err[0], err


def test_the_first_line_names_the_malloc_that_is_mapped(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 0 00:00 0 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4\n")
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    assert malloc_in_use({RESTARTED_ENV: str(lib)}, str(maps)) == "libtcmalloc_minimal.so.4"
    assert malloc_in_use({}, str(maps)) == "libtcmalloc_minimal.so.4"  # preloaded by the user, not the restart
    maps.write_text("7f00-7f10 r-xp 0 00:00 0 /usr/lib/x86_64-linux-gnu/libc.so.6\n")  # ld.so could not load it
    assert malloc_in_use({RESTARTED_ENV: str(lib)}, str(maps)) == "system (libtcmalloc_minimal.so.4 did not load)"
    assert malloc_in_use({}, str(maps)) == "system"
    maps.write_text("7f00-7f10 r-xp 0 00:00 0 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")  # the user's LD_PRELOAD
    assert malloc_in_use({}, str(maps)) == "libjemalloc.so.2"


def test_a_command_run_in_process_never_restarts_the_process(monkeypatch):
    from annotated_transformer.cli import train

    calls = []
    monkeypatch.setattr(train, "launch", lambda argv: calls.append(("relaunch", argv)))
    monkeypatch.setattr(train, "main", lambda argv, prog=None: calls.append(("main", argv)) or 0)
    with pytest.raises(SystemExit):
        run("train", ["--config", "copy.yaml"], "train.py")  # as a test or a notebook calls it
    with pytest.raises(SystemExit):
        run("train", ["--config", "copy.yaml"], "train.py", whole_process=True)  # as scripts/train.py does
    assert calls == [("main", ["--config", "copy.yaml"]), ("relaunch", ["--config", "copy.yaml"]),
                     ("main", ["--config", "copy.yaml"])]


def _glibc_library(name: str) -> Path | None:
    """A library of the C library's own folder that Python and torch do not load (found beside libc.so.6)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("/libc.so.6"):
            candidate = Path(line.split()[-1]).parent / name
            return candidate if candidate.is_file() else None
    return None


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("launcher, library", [([str(ROOT / "scripts" / "train.py")], "a path"),
                                               (["-m", "annotated_transformer", "train"], "mimalloc")])
def test_the_train_command_restarts_itself_with_the_library_preloaded(tmp_path, launcher, library):
    """Both ways of starting training restart under the library, given by path or by name (the lock's mimalloc)."""
    if library == "a path":
        lib = _glibc_library("libanl.so.1")  # glibc's asynchronous name lookup: harmless to preload
        if lib is None:
            pytest.skip("no libanl.so.1 beside libc.so.6 here")
        library, mapped = str(lib), lib.resolve().name
    else:
        mapped = "libmimalloc.so.3"
    proc = subprocess.run([sys.executable, *launcher, "--config", "copy.yaml",
                           "train.max_steps=2", "train.device=cpu", f"train.out_dir={tmp_path / 'run'}",
                           f"train.malloc={library}"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=without_the_suites_setting())
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = next(line for line in proc.stdout.splitlines() if "parameters | device" in line)
    assert f"| malloc {mapped} |" in first, first  # the restarted process, with the library mapped, not just asked for


@pytest.mark.parametrize("command", ["train", "benchmark"])  # the benchmark times training steps as training runs them
def test_a_bad_malloc_setting_is_one_line_and_exit_2(capsys, command):
    with pytest.raises(SystemExit) as done:
        run(command, ["--config", "copy.yaml", "train.malloc=jemalloc"], f"{command}.py", whole_process=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: train.malloc must be auto, system, tcmalloc, mimalloc or the path")


def _malloc_here() -> dict[str, str]:
    """What a fresh process started by the benchmark sees: its malloc and its LD_PRELOAD."""
    return {"malloc": malloc_in_use(), "preload": os.environ.get("LD_PRELOAD", "")}


@pytest.mark.slow
@linux_only
def test_the_benchmarks_training_processes_get_the_library_and_this_process_keeps_its_own(monkeypatch):
    lib = _glibc_library("libanl.so.1")
    if lib is None:
        pytest.skip("no libanl.so.1 beside libc.so.6 here")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(RESTARTED_ENV, raising=False)
    assert in_fresh_process("probe", _malloc_here, preload=lib) == {"malloc": lib.resolve().name, "preload": str(lib)}
    assert "LD_PRELOAD" not in os.environ and RESTARTED_ENV not in os.environ  # decoding here stays as it was
    assert in_fresh_process("probe", _malloc_here) == {"malloc": "system", "preload": ""}


@pytest.mark.slow
@linux_only
def test_the_benchmark_profiles_training_steps_under_the_library(multi30k_dir, data_cache_dir):
    lib = _glibc_library("libanl.so.1")
    if lib is None:
        pytest.skip("no libanl.so.1 beside libc.so.6 here")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--config", "tiny.yaml",
                           "--profile", "--steps", "1", "--warmup", "1", "train.device=cpu", f"train.malloc={lib}",
                           f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=without_the_suites_setting())
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("tiny: "))  # the profile's first line
    assert f"malloc {lib.resolve().name} (1 steps)" in header, header


@linux_only
def test_a_cpu_run_restarts_under_tcmalloc_or_says_how_to_install_it(monkeypatch, capsys, tcmalloc_dir, tmp_path):
    for name in ("LD_PRELOAD", RESTARTED_ENV, "RANK"):
        monkeypatch.delenv(name, raising=False)
    restarts = []
    monkeypatch.setattr(malloc, "restart_with", restarts.append)  # exec would replace the test process
    monkeypatch.setattr(malloc, "search_dirs", lambda environ: [tmp_path / "nothing"])
    malloc.preload_or_note("auto", "cpu")
    assert restarts == [] and "sudo apt install libtcmalloc-minimal4" in capsys.readouterr().err
    malloc.preload_or_note("auto", "cuda")  # a GPU run: neither
    malloc.preload_or_note("system", "cpu")  # the system's asked for: no note
    monkeypatch.setenv("RANK", "1")
    malloc.preload_or_note("auto", "cpu")  # under torchrun only rank 0 says it
    assert restarts == [] and capsys.readouterr().err == ""
    monkeypatch.delenv("RANK")
    monkeypatch.setattr(malloc, "search_dirs", lambda environ: [tcmalloc_dir])
    malloc.preload_or_note("auto", "cpu")
    assert restarts == [tcmalloc_dir / "libtcmalloc_minimal.so.4"] and capsys.readouterr().err == ""


def _config_with_malloc(folder: Path, value: str) -> Path:
    """A config file (the copy task's settings) that sets train.malloc to `value`."""
    text = (ROOT / "configs" / "copy.yaml").read_text(encoding="utf-8")
    path = folder / "downloaded.yaml"
    path.write_text(text.replace("\ntrain:\n", f"\ntrain:\n  malloc: {value}\n", 1), encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["./evil.so", "/tmp/libevil.so.1", "libjemalloc.so.2"])
def test_a_config_file_that_names_a_library_is_refused_and_nothing_restarts(tmp_path, monkeypatch, capsys, value):
    config = _config_with_malloc(tmp_path, value)
    restarts = []
    monkeypatch.setattr(malloc, "restart_with", restarts.append)
    monkeypatch.setattr(malloc.os, "execve", lambda *args: restarts.append(args))
    monkeypatch.delenv(RESTARTED_ENV, raising=False)
    with pytest.raises(SystemExit) as done:
        run("train", ["--config", str(config), "train.device=cpu"], "train.py", whole_process=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {config}: train.malloc={value} is a library's path"), err
    assert f"on the command line (train.malloc={value})" in err[0] and f"LD_PRELOAD={value}" in err[0]
    assert restarts == []


def test_a_config_file_may_name_an_allocator_and_a_sweeps_grid_no_library(tmp_path):
    from annotated_transformer.lab.sweep import parse_grid

    for name in ("auto", "system", "tcmalloc"):
        assert load_config(str(_config_with_malloc(tmp_path, name))).train.malloc == name
    with pytest.raises(ConfigError, match=r"grid.yaml: train.malloc=/opt/x.so is a library's path"):
        parse_grid({"train.malloc": ["system", "/opt/x.so"]}, "grid.yaml")  # each run's command line comes from it


@linux_only
def test_the_same_path_on_the_command_line_is_preloaded(tcmalloc_dir, tmp_path, monkeypatch):
    from annotated_transformer.cli import train

    lib = tcmalloc_dir / "libtcmalloc_minimal.so.4"  # an empty file: restart_with is replaced, nothing loads it
    config = _config_with_malloc(tmp_path, "system")
    assert load_config(str(config), [f"train.malloc={tmp_path / 'none.so'}"]).train.malloc == str(tmp_path / "none.so")
    restarts = []
    monkeypatch.setattr(malloc, "restart_with", restarts.append)
    for name in ("LD_PRELOAD", RESTARTED_ENV):
        monkeypatch.delenv(name, raising=False)
    train.relaunch_with_malloc(["--config", str(config), "train.device=cpu", f"train.malloc={lib}"])
    assert restarts == [lib.resolve()]


@linux_only
def test_auto_falls_back_to_the_locks_mimalloc_and_prefers_tcmalloc(tmp_path, tcmalloc_dir):
    mimalloc_dir = tmp_path / "cmeel.prefix" / "lib"
    mimalloc_dir.mkdir(parents=True)
    (mimalloc_dir / "libmimalloc.so.3").write_bytes(b"")
    assert library_to_preload("auto", "cpu", {}, [mimalloc_dir]) == mimalloc_dir / "libmimalloc.so.3"
    assert library_to_preload("auto", "cpu", {}, [mimalloc_dir, tcmalloc_dir]) == \
        tcmalloc_dir / "libtcmalloc_minimal.so.4"  # measured faster: tcmalloc first where the machine has it
    assert library_to_preload("mimalloc", "cpu", {}, [tcmalloc_dir, mimalloc_dir]) == mimalloc_dir / "libmimalloc.so.3"
    assert library_to_preload("auto", "cpu", {RESTARTED_ENV: "system"}, [mimalloc_dir]) is None  # the suite's setting


@linux_only
def test_the_lock_installs_a_mimalloc_that_the_search_finds():
    found = malloc.find_library(malloc.MIMALLOC_FILES, malloc.search_dirs(os.environ))
    assert found is not None and found.parent.parts[-2:] == ("cmeel.prefix", "lib"), found


