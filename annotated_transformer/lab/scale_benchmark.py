"""`benchmark --scale`: the data path at WMT14's size, in one command, against the goals of a 2-core machine.

On a synthetic corpus of WMT length (`synthetic_corpus`: 4.5 million pairs by default, made where missing and
reused after), two commands run as a user runs them, each in its own process with a time limit:

1. prepare-data with the config's data settings and an empty cache: its wall time and peak memory;
2. train on that cache for a few optimizer steps (train.max_steps, no BLEU, no final scores): the seconds from
   launching it to its first step (metrics.jsonl's start record), to the end of that step, and its peak memory.

Peak memory is the command's processes together (the command and every process it starts, all in a session of
their own): the highest sum of their proportional set sizes (resident pages, a page shared by k processes counted
1/k to each), sampled every SAMPLE_SECONDS, or the kernel's high-water mark of the largest process alone where that
is higher (it misses no spike between samples). Each goal is judged from these measured figures; a command that
failed or ran out of time meets none of its goals. The temporary cache and run are deleted at the end; the corpus
is kept.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..harness.run_dir import read_metrics
from ..runtime.device import cpu_info, select_device
from ..runtime.errors import ConfigError
from ..runtime.files import writing
from .speed_report import cpu_flags, machine_line
from .synthetic_corpus import LANGS, CorpusSpec, check_folder, has_corpus, multi30k_lines, write_corpus

SAMPLE_SECONDS = 0.25  # how often a command's memory is sampled
PREPARE_TIMEOUT_S = 3600.0  # six times the goal: a prepare that slow has missed it anyway
TRAIN_TIMEOUT_S = 3600.0
GB = 2**30
WMT14_PAIRS = 4_500_000  # WMT14 English-German's training pairs, the paper's corpus: the default size


@dataclass(frozen=True)
class Goal:
    """One goal: `figure` (a key of the measured figures) at most `at_most` `unit`."""

    figure: str
    what: str
    at_most: float
    unit: str


GOALS = (
    Goal("prepare_seconds", "prepare-data, wall time", 600.0, "s"),
    Goal("prepare_memory_gb", "prepare-data, peak memory", 4.0, "GB"),
    Goal("start_seconds", "train, launch to the first step", 60.0, "s"),
    Goal("train_memory_gb", "train, peak memory", 3.0, "GB"),
)


def judge(figures: dict[str, float | None], goals: Sequence[Goal] = GOALS) -> list[dict[str, Any]]:
    """Each goal with the figure measured for it and whether it is met (a missing figure, None, never is)."""
    out = []
    for goal in goals:
        value = figures.get(goal.figure)
        out.append({**asdict(goal), "value": value, "met": value is not None and value <= goal.at_most})
    return out


# --------------------------------------------------------------------------- a command, measured


@dataclass
class Measured:
    """What one command did: its wall time, exit code, peak memory and when it reached each mark."""

    command: str  # the command line
    seconds: float = 0.0
    exit_code: int | None = None  # None: stopped at the time limit
    timed_out: bool = False
    peak_sampled_gb: float = 0.0  # the highest sampled sum of the processes' proportional set sizes
    peak_largest_gb: float = 0.0  # the kernel's high-water mark of the largest process (ru_maxrss)
    marks: dict[str, float | None] = field(default_factory=dict)  # mark -> seconds from the launch
    error: str | None = None  # the last line the command wrote, when it failed

    @property
    def ok(self) -> bool:
        """Whether the command ran to its end and succeeded."""
        return self.exit_code == 0

    @property
    def peak_memory_gb(self) -> float:
        """The peak memory the goals are judged on: the higher of the two measures."""
        return max(self.peak_sampled_gb, self.peak_largest_gb)

    def as_dict(self) -> dict[str, Any]:
        """The record in the result's JSON (the marks among the other figures)."""
        record = asdict(self)
        marks = record.pop("marks")
        return {**record, **marks, "peak_memory_gb": self.peak_memory_gb}


def session_processes(session: int) -> list[int]:
    """The processes of a session (from /proc): a command started in a session of its own and everything it starts,
    even those whose parent has ended ([session] where there is no /proc)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return [session]
    found = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after the command's name, which may hold spaces and parentheses
        if int(fields[3]) == session:  # state, parent, process group, session
            found.append(int(name))
    return found


def resident_bytes(pid: int) -> int:
    """A process's proportional set size (smaps_rollup's Pss), else its resident set size; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def max_rss_gb(usage: resource.struct_rusage) -> float:
    """ru_maxrss in GB (KiB on Linux, bytes on macOS)."""
    return usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024) / GB


def run_measured(argv: Sequence[str], logs: Path, timeout: float, *,
                 marks: Callable[[float], dict[str, float | None]] | None = None,
                 echo: Callable[[str], None] | None = None, echo_stdout: bool = True) -> Measured:
    """Run `argv` in a session of its own, its output in logs.out / logs.err, sampling its processes' memory until it
    ends or `timeout` seconds pass (then the whole session is stopped). `marks(launch_time)`: the marks reached so
    far, in seconds from the launch, asked at every sample. `echo`: each line the command writes (with
    `echo_stdout=False`, on its standard error only), as it comes."""
    out_path, err_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    result = Measured(command=shlex.join(["python", *map(str, argv[1:])]))
    followed = [LineFollower(err_path), *([LineFollower(out_path)] if echo_stdout else [])]

    def look() -> None:
        if marks is not None:
            result.marks = marks(launched)
        for follower in followed:
            for line in follower.new_lines(final=result.exit_code is not None or result.timed_out):
                if echo:
                    echo(line)

    launched, t0 = time.time(), time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, start_new_session=True)
    usage = None
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = result.exit_code = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - t0 > timeout:
                result.timed_out = True
                break
            resident = sum(resident_bytes(p) for p in session_processes(proc.pid))
            result.peak_sampled_gb = max(result.peak_sampled_gb, resident / GB)
            look()
            time.sleep(SAMPLE_SECONDS)
    finally:
        if proc.returncode is None:  # timed out, or this process was interrupted: stop the command's whole session
            stop_session(proc)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
    result.seconds = time.perf_counter() - t0
    result.peak_largest_gb = max_rss_gb(usage) if usage is not None else 0.0
    look()  # what came since the last sample
    if not result.ok:
        result.error = (f"stopped after {timeout:.0f} s" if result.timed_out
                        else last_line(err_path) or last_line(out_path) or f"exit code {result.exit_code}")
    return result


def stop_session(proc: subprocess.Popen[bytes]) -> None:
    """Stop the command's session: SIGTERM (a training saves and stops), then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        t_end = time.perf_counter() + wait
        while time.perf_counter() < t_end:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
            time.sleep(0.1)


class LineFollower:
    """The lines a growing file gets, as they come."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def new_lines(self, final: bool = False) -> list[str]:
        """The whole lines written since the last call (with `final`, the unfinished last one too)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        if final and self.rest:
            lines, self.rest = [*lines, self.rest], b""
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]


def last_line(path: Path) -> str | None:
    """The last non-empty line of a file (None when it has none)."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def training_marks(metrics: Path) -> Callable[[float], dict[str, float | None]]:
    """marks(launch_time) for a training run, from its metrics.jsonl: seconds from the launch to the first 'start'
    record (`start_seconds`: training begins its first step) and to the first 'train' record (`first_step_seconds`:
    with train.log_every=1, the end of the first step), and the start record's own `startup_seconds` (the Trainer's
    build to its first step); the file is no longer read once they are all there."""
    found: dict[str, float | None] = {}
    first = {"start": "start_seconds", "train": "first_step_seconds"}

    def marks(launched: float) -> dict[str, float | None]:
        if len(found) == 3 or not metrics.is_file():
            return dict(found)
        for record in read_metrics(metrics):
            mark = first.get(record.get("kind", ""))
            if mark and mark not in found and "time" in record:
                found[mark] = record["time"] - launched
                if mark == "start_seconds":
                    found["startup_seconds"] = record.get("startup_seconds")
        return dict(found)

    return marks


# --------------------------------------------------------------------------- the benchmark


def machine_facts(device: torch.device) -> dict[str, Any]:
    """The machine a figure was measured on: CPU, its bf16 and AMX support, cores, threads, memory, versions."""
    return {"machine": machine_line(device), "cpu": cpu_info("model name") or platform.processor(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(), **cpu_flags(),
            "memory_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB,
            "device": str(device), "torch": torch.__version__, "python": platform.python_version()}


def default_data_dir(cfg: Config, pairs: int) -> Path:
    """Where the corpus goes without --data-dir: beside the data caches, one folder a size."""
    return Path(cfg.data.cache_dir).expanduser() / f"synthetic-{pairs}"


def corpus_overrides(folder: Path, cache_dir: Path) -> list[str]:
    """The overrides that point a config at the synthetic corpus in `folder`, with a cache of its own."""
    return ["data.dataset=files", f"data.train={folder / 'train'}", f"data.val={folder / 'val'}",
            f"data.test={folder / 'test'}", f"data.cache_dir={cache_dir}"]


def training_overrides(out_dir: Path, steps: int) -> list[str]:
    """A short training: `steps` optimizer steps, a log record each, validation loss only, no final scores."""
    return [f"train.out_dir={out_dir}", "train.epochs=0", f"train.max_steps={steps}", "train.log_every=1",
            "train.bleu_every=0", "train.best_metric=loss", "train.target_bleu=0", "train.stop_at_target=false",
            "train.final_eval=false", "train.average_last=0", "train.progress=false", "train.tensorboard=false"]


def scale_benchmark(config: str, overrides: Sequence[str], cfg: Config, pairs: int = WMT14_PAIRS,
                    data_dir: str | Path | None = None, steps: int = 10, log: Callable[[str], None] = print
                    ) -> dict[str, Any]:
    """Make (or reuse) the corpus, then measure prepare-data and the start of training on it (module docstring).

    `config` and `overrides` are the command line's (each command gets them, then the corpus's and the short
    training's overrides); `cfg` is what they load to.
    """
    d = cfg.data
    if {d.src_lang, d.tgt_lang} != set(LANGS):
        raise ConfigError(f"--scale's corpus is German and English; the config translates {d.src_lang}->"
                          f"{d.tgt_lang}: set data.src_lang and data.tgt_lang to de and en (either way round)")
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    spec = CorpusSpec(pairs)
    spec.check()
    folder = Path(data_dir).expanduser() if data_dir else default_data_dir(cfg, pairs)
    device = select_device(cfg.train.device)
    result: dict[str, Any] = {"benchmark": "scale", "date": time.strftime("%Y-%m-%d"), **machine_facts(device),
                              "config": cfg.name, "overrides": list(overrides), "steps": steps}
    corpus = {"folder": str(folder), **asdict(spec), "made": False, "make_seconds": None}
    if not has_corpus(folder, spec):
        from ..data.multi30k import resolve_multi30k_dir

        log(f"making the synthetic corpus ({pairs:,} pairs of WMT length) in {folder} ...")
        t0 = time.perf_counter()
        check_folder(folder, False, "--data-dir")  # before Multi30k is looked for (or downloaded)
        write_corpus(folder, spec, multi30k_lines(resolve_multi30k_dir(d, log=log)), log=log, option="--data-dir")
        corpus.update(made=True, make_seconds=time.perf_counter() - t0)
    else:
        log(f"the synthetic corpus of {pairs:,} pairs in {folder}")
    result["corpus"] = corpus
    command = [sys.executable, "-m", "annotated_transformer"]
    with writing(folder, "make a work folder in"):  # a read-only corpus folder: one line
        work = Path(tempfile.mkdtemp(prefix="scale-benchmark-", dir=folder))  # the cache and the run, deleted after
    try:
        data = corpus_overrides(folder, work / "cache")
        log("prepare-data on it, an empty cache ...")
        prepare = run_measured([*command, "prepare-data", "--config", config, *overrides, *data, "--json"],
                               work / "prepare", PREPARE_TIMEOUT_S, echo=lambda line: log(f"  | {line}"),
                               echo_stdout=False)  # its standard output is the statistics' JSON
        result["prepare"] = {**prepare.as_dict(), "stats": prepare_stats(work / "prepare.out")}
        log(f"  {summary_of(prepare)}")
        train = None
        if prepare.ok:
            log(f"train on it, {steps} steps ...")
            train = run_measured([*command, "train", "--config", config, *overrides, *data,
                                  *training_overrides(work / "run", steps)], work / "train", TRAIN_TIMEOUT_S,
                                 marks=training_marks(work / "run" / "metrics.jsonl"),
                                 echo=lambda line: log(f"  | {line}"))
            result["train"] = train.as_dict()
            log(f"  {summary_of(train)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["goals"] = judge(figures(prepare, train))
    return result


def prepare_stats(path: Path) -> dict[str, Any] | None:
    """prepare-data --json's statistics (its standard output), or None when it wrote none."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def figures(prepare: Measured, train: Measured | None) -> dict[str, float | None]:
    """The figures the goals are judged on; None where the command did not succeed (or never reached the mark)."""
    return {"prepare_seconds": prepare.seconds if prepare.ok else None,
            "prepare_memory_gb": prepare.peak_memory_gb if prepare.ok else None,
            "start_seconds": train.marks.get("start_seconds") if train is not None else None,
            "train_memory_gb": train.peak_memory_gb if train is not None and train.ok else None}


def summary_of(m: Measured) -> str:
    """A command's figures on one line."""
    if not m.ok:
        return f"failed after {m.seconds:.1f} s: {m.error}"
    marks = "".join(f" | {name} after {m.marks[key]:.1f} s" for key, name in
                    (("start_seconds", "first step begun"), ("first_step_seconds", "first step done"))
                    if m.marks.get(key) is not None)
    return f"{m.seconds:.1f} s | peak memory {m.peak_memory_gb:.2f} GB{marks}"


def format_scale(result: dict[str, Any]) -> str:
    """The benchmark's summary: the machine, the corpus, each goal met or not."""
    c = result["corpus"]
    made = f", made in {c['make_seconds']:.1f} s" if c["made"] else ""
    lines = [f"machine: {result['machine']} | {result['cores']} cores, {result['memory_gb']:.0f} GB | torch "
             f"{result['torch']} | config {result['config']}",
             f"corpus: {c['pairs']:,} synthetic pairs of WMT length in {c['folder']}{made}"]
    for goal in result["goals"]:
        value = "failed" if goal["value"] is None else f"{goal['value']:.2f} {goal['unit']}"
        lines.append(f"  {goal['what']:<34} {value:>12}   goal <= {goal['at_most']:g} {goal['unit']}: "
                     f"{'met' if goal['met'] else 'NOT met'}")
    return "\n".join(lines)
