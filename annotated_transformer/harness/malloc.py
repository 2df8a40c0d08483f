"""The training process under tcmalloc on the CPU (`train.malloc`): glibc's malloc is slow at what a step asks of it.

A CPU training step allocates and frees hundreds of tensors whose sizes change with every batch
shape, among the many small blocks oneDNN keeps for its compiled kernels. glibc's malloc searches
its heap for each; tcmalloc takes a block from a list per size class, which trains faster with the
same losses to the last digit (docs/performance.md, "tcmalloc"). A process
cannot change its malloc once it runs, so on the CPU, where the machine has tcmalloc, the train
command starts itself again with it preloaded (LD_PRELOAD) once it has read its config, before it
builds anything: a launcher step (`cli.train.relaunch_with_malloc`, before the command's `main`) with
the same arguments, and `exec` keeps the process id, so torchrun, a sweep and the run directory's lock
see one process throughout. (The package and torch load twice: about 2.5 s
more at start-up on a 2-core CPU.) The benchmark starts the processes that time training steps
with it preloaded, and decodes in its own process with the system's malloc, as translating does.

Where the machine has no tcmalloc, 'auto' preloads mimalloc from the `cmeel-mimalloc` package the
lock installs on Linux, so a fresh machine needs nothing installed: glibc's malloc keeps its largest
heap, and cpu_15min's first 200 steps peaked about a sixth lower and ran 1.01-1.06x as fast under
mimalloc (docs/performance.md, "Memory over a long run").
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..runtime.errors import ConfigError

# Set in a process started with a library preloaded: that library. 'system' keeps this process and the processes it
# starts on the C library's malloc whatever train.malloc says (the test suite sets it: timings and page faults of
# the system's malloc on every machine).
RESTARTED_ENV = "ANNOTATED_TRANSFORMER_MALLOC"
TCMALLOC_FILES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")  # gperftools' (the minimal one has no profiler)
MIMALLOC_FILES = ("libmimalloc.so.3", "libmimalloc.so")  # Microsoft's, as the cmeel-mimalloc wheel ships it
LIBRARIES = {"tcmalloc": TCMALLOC_FILES, "mimalloc": MIMALLOC_FILES}  # train.malloc's names, auto's order
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and AMD ROCm's driver nodes
INSTALL_HINT = ("Debian/Ubuntu: `sudo apt install libtcmalloc-minimal4`; Fedora: `sudo dnf install gperftools-libs`; "
                "conda: `conda install gperftools`")


def search_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Where to look for tcmalloc: LD_LIBRARY_PATH, this Python's prefixes (a venv's, conda's), the system's."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""  # x86_64-linux-gnu on Debian and Ubuntu
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [f"{sys.prefix}/lib", f"{sys.base_prefix}/lib", f"/usr/lib/{multiarch}", f"/lib/{multiarch}",
             "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    # cmeel packages (cmeel-mimalloc, in the lock) install their libraries under site-packages/cmeel.prefix/lib
    dirs += [f"{sysconfig.get_path(kind)}/cmeel.prefix/lib" for kind in ("platlib", "purelib")]
    return list(dict.fromkeys(map(Path, dirs)))  # as paths, so /usr/lib/ (no multiarch) and /usr/lib count once


def find_library(files: Iterable[str], dirs: Iterable[Path]) -> Path | None:
    """The first of `files` (names in order of preference) in `dirs`, or None."""
    dirs = list(dirs)
    for name in files:
        for folder in dirs:
            if (folder / name).is_file():
                return folder / name
    return None



def runs_on_cpu(device: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a run with train.device `device` trains on the CPU.

    'auto' does where no GPU driver is present, or where CUDA_VISIBLE_DEVICES hides every GPU ('' or -1).
    """
    if device == "auto":
        hidden = environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")
        return hidden or not any(os.path.exists(node) for node in GPU_DEVICE_FILES)
    return device.split(":")[0] == "cpu"


def auto_applies(device: str, environ: Mapping[str, str]) -> bool:
    """Whether 'auto' looks for tcmalloc: a CPU run on Linux, not yet restarted, with nothing preloaded by the user."""
    return (sys.platform.startswith("linux") and RESTARTED_ENV not in environ and not environ.get("LD_PRELOAD")
            and runs_on_cpu(device, environ))


def library_to_preload(setting: str, device: str, environ: Mapping[str, str],
                       dirs: Iterable[Path] | None = None) -> Path | None:
    """The malloc library a training process should run with, or None to go on as it is.

    `setting` is train.malloc, checked by the config. 'auto': on Linux, for a run on the CPU where the user
    preloads nothing already, tcmalloc where one is found, else mimalloc (the lock's cmeel-mimalloc);
    'system': never; 'tcmalloc' or 'mimalloc': that library or an error; a path: that library or an error.
    A path comes from the command line only: `config.load_config` refuses one in a config file, which would
    otherwise run the code of a library the file names.
    """
    if setting == "system" or RESTARTED_ENV in environ:  # the restarted process does not restart again
        return None
    if not sys.platform.startswith("linux"):
        if setting == "auto":
            return None
        raise ConfigError(f"train.malloc={setting} needs Linux (it preloads the library with LD_PRELOAD); "
                          "use train.malloc=auto or system here")
    if setting == "auto" and not auto_applies(device, environ):
        return None
    if setting not in ("auto", *LIBRARIES):
        path = Path(setting).expanduser()
        if not path.is_file():
            raise ConfigError(f"train.malloc={setting}: no such file; give the path of a malloc library "
                              "(for example libtcmalloc_minimal.so.4) or train.malloc=auto")
        return path.resolve()
    dirs = search_dirs(environ) if dirs is None else list(dirs)
    for name in LIBRARIES if setting == "auto" else (setting,):
        found = find_library(LIBRARIES[name], dirs)
        if found is not None:
            return found
    if setting == "auto":
        return None
    hint = INSTALL_HINT if setting == "tcmalloc" else "uv sync, or pip install cmeel-mimalloc"
    raise ConfigError(f"train.malloc={setting}: none of {', '.join(LIBRARIES[setting])} in "
                      f"{', '.join(map(str, dirs))}; install it ({hint}), give its path on the command line "
                      f"(train.malloc=/path/to/{LIBRARIES[setting][0]}), or use train.malloc=auto")


def restart_with(library: Path) -> None:
    """Replace this process with the same command, `library` preloaded; if that fails, say so and go on."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    env[RESTARTED_ENV] = str(library)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # orig_argv keeps -m, -X, the script
    except OSError as exc:
        print(f"note: could not restart {sys.executable or 'Python'} with {library} preloaded ({exc}); going on "
              "with the system's malloc (train.malloc=system skips the restart)", file=sys.stderr, flush=True)


def training_malloc(setting: str, device: str) -> Path | None:
    """`library_to_preload` for this process; where 'auto' finds none for a CPU run, rank 0 says how to get one."""
    library = library_to_preload(setting, device, os.environ)
    rank0 = os.environ.get("RANK", "0") == "0"
    if library is None and setting == "auto" and auto_applies(device, os.environ) and rank0:
        print("note: training on the CPU with the system's malloc, which keeps its largest heap (neither tcmalloc "
              "nor the lock's mimalloc was found); under tcmalloc cpu_15min trained 1.24x faster on a 2-core Intel "
              f"CPU: install it and training uses it ({INSTALL_HINT}; train.malloc in docs/training.md)",
              file=sys.stderr, flush=True)
    return library


def preload_or_note(setting: str, device: str) -> None:
    """At the start of a train process: restart under the `training_malloc` library, if there is one."""
    library = training_malloc(setting, device)
    if library is not None:
        restart_with(library)


@contextlib.contextmanager
def preloaded_for_children(library: Path | None) -> Iterator[None]:
    """Processes started in this block run with `library` preloaded (LD_PRELOAD); this one's malloc is unchanged.

    For the benchmark, which times training steps in fresh processes as training runs them, and decoding in
    this one as the translate command does.
    """
    if library is None:
        yield
        return
    before = {key: os.environ.get(key) for key in ("LD_PRELOAD", RESTARTED_ENV)}
    os.environ["LD_PRELOAD"] = ":".join(filter(None, [str(library), before["LD_PRELOAD"]]))
    os.environ[RESTARTED_ENV] = str(library)  # what `malloc_in_use` names there
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def malloc_in_use(environ: Mapping[str, str] = os.environ, maps: str = "/proc/self/maps") -> str:
    """For the run's first line: the file name of the malloc library mapped into this process, or 'system'.

    That is the library the restart preloaded, or one the user preloaded (a tcmalloc, jemalloc or
    mimalloc in /proc/self/maps). A library the restart asked for that is not mapped failed to load
    (ld.so says why on stderr): that reads 'system (LIB did not load)'.
    """
    try:
        mapped = {Path(line.split()[-1]).name for line in Path(maps).read_text().splitlines() if "/" in line}
    except OSError:
        mapped = None  # no /proc to look at: trust ld.so, which would have said otherwise
    wanted = environ.get(RESTARTED_ENV)
    if wanted and wanted != "system":
        name = Path(wanted).resolve().name
        return name if mapped is None or name in mapped else f"system ({name} did not load)"
    preloaded = sorted(n for n in mapped or () if n.startswith(("libtcmalloc", "libjemalloc", "libmimalloc")))
    return preloaded[0] if preloaded else "system"
