"""Sweeps: every combination of a grid of dotted overrides, times seeds, each trained in its own run directory.

    <out>/<setting>/seed<N>/     one run (train.out_dir), continued with train.resume=auto when started again
    <out>/<setting>/seed<N>.log  its output
    <out>/sweep.md  sweep.csv    per setting: mean and standard deviation over seeds of val (and test) BLEU,
                                 time and compute (TFLOP) to train.target_bleu, steps, minutes, compute, tokens/s,
                                 parameters (the copy task: exact copies and val loss instead of BLEU); one row
                                 per run in the CSV
    <out>/sweep.html  sweep.png  val BLEU against training minutes, a faint line per run, the mean per setting
                                 (not for the copy task, which has no BLEU)

A grid is a YAML mapping of dotted keys to lists of values (every combination is a setting), or a
list of such mappings (each one setting, for choices that are not a product). Runs are separate
processes of the training script, so a killed sweep loses at most the unfinished epochs of the
runs it was running, and starting it again skips finished runs and continues the others (finished as the train
command judges it: a grown budget continues a run, changed settings are refused in its log).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import config_to_dict, load_config
from ..config.loading import UniqueKeyLoader, refuse_library_from_file
from ..runtime.device import usable_cores
from ..runtime.errors import SAME_SIGNAL_SECONDS, ConfigError, RunDirError, UserError, listed
from ..runtime.files import atomic_write, writing
from ..harness.run_dir import RunDir, final_record
from ..harness.tasks import TaskFiles
from .seed_statistics import (COMPARISON_TITLE, REPORT_FILES, TEST_SCORES, RunResult, collect_results,
                              read_result, test_scores, write_report)


@dataclass(frozen=True)
class Run:
    """One training run of a sweep: a setting (its overrides) and a seed."""

    setting: str  # the folder name: the overrides joined by ',' ('base' for none)
    overrides: tuple[str, ...]
    seed: int
    path: Path  # the run directory

    @property
    def log_file(self) -> Path:
        """The training's output (stdout and stderr), beside its run directory."""
        return self.path.with_name(f"{self.path.name}.log")

    @property
    def pid_file(self) -> Path:
        """Holds the process id of the training while it runs (a sweep killed with SIGKILL leaves it running)."""
        return self.path.with_name(f"{self.path.name}.pid")

    def running_elsewhere(self) -> int | None:
        """The id of a live training process of this run started by an earlier sweep, if there is one."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except (OSError, ValueError):
            return None
        return pid if f"train.out_dir={self.path}" in cmdline.split("\0") else None


def _format_value(value: Any) -> str:
    """A YAML value as a dotted override's right-hand side (lists as [a,b], booleans lowercase)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    return str(value)


def _setting_name(overrides: tuple[str, ...]) -> str:
    """The folder name of a setting: its overrides joined by ',' (path separators replaced)."""
    return ",".join(o.replace("/", "_") for o in overrides) or "base"


def parse_grid(grid: Any, source: str = "grid") -> list[tuple[str, ...]]:
    """The settings of a grid (see the module docstring), each as a tuple of 'key=value' overrides."""
    if grid is None:
        return [()]
    if isinstance(grid, dict):  # a product: a list is the values to try, anything else a fixed value
        blocks = [dict(zip(grid, combo)) for combo in itertools.product(
            *[v if isinstance(v, list) else [v] for v in grid.values()])]
    elif isinstance(grid, list):  # one setting each, values as they are (a list is one list-valued key)
        blocks = grid
    else:
        blocks = [grid]
    settings: list[tuple[str, ...]] = []
    for block in blocks:
        if not isinstance(block, dict) or not all(isinstance(k, str) and "." in k for k in block):
            raise ConfigError(f"{source}: expected a mapping of dotted keys to lists of values "
                              "(train.lr_factor: [0.5, 1.0]) or a list of mappings (one setting each)")
        for key, value in block.items():  # its values reach each run's command line, where a path is allowed
            refuse_library_from_file(key, value, source)
        settings.append(tuple(f"{k}={_format_value(v)}" for k, v in block.items()))
    if not settings:
        raise ConfigError(f"{source}: no settings (an empty list?); give at least one value per key")
    if len(set(settings)) != len(settings):
        raise ConfigError(f"{source}: the same setting appears twice")
    return settings


def read_grid(path: str | Path) -> list[tuple[str, ...]]:
    """The settings of a grid file; one line for a missing or malformed file."""
    path = Path(path)
    try:
        grid = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except OSError as exc:
        raise ConfigError(f"cannot read the grid {path}: {exc.strerror or exc}; give a YAML file of dotted "
                          "keys and lists of values") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"the grid {path} is not valid YAML ({problem})") from None
    return parse_grid(grid, str(path))


def grid_runs(settings: list[tuple[str, ...]], seeds: list[int], out: Path) -> list[Run]:
    """Every (setting, seed) pair, setting by setting, as a Run with its directory under `out`."""
    return [Run(_setting_name(s), s, seed, out / _setting_name(s) / f"seed{seed}") for s in settings for seed in seeds]


def check_out(out: Path) -> None:
    """One line, before anything runs, for an --out that is a file or a folder of other files: a sweep writes its
    report (sweep.md, .csv, .html, .png) only into a new folder or one an earlier sweep wrote (SETTING/seedN)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give the folder the sweep writes its runs and report into")
    if not out.is_dir() or not any(out.iterdir()):
        return
    runs = [p for p in out.glob("*/seed*") if p.name.removeprefix("seed").removesuffix(".log").isdigit()]
    if not runs:
        names = sorted(p.name for p in out.iterdir())
        shown = listed(names)
        raise UserError(f"--out {out} holds files no sweep wrote ({shown}); a sweep writes its runs and its report "
                        "there: choose a new --out (a folder that does not exist yet, or an empty one)")


def check_compare_out(out: Path, overwrite: bool) -> None:
    """One line, before anything is written, for a --compare --out that is a file, a folder of other files, or an
    earlier comparison's folder without --overwrite: a comparison writes only into a new or empty folder, or
    replaces the report of an earlier one (its sweep.md titled so), never a file it did not write."""
    from ..runtime.files import refuse_to_replace

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give the folder the comparison writes its report into")
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not names:
        return
    report = out / "sweep.md"
    try:
        ours = report.is_file() and report.read_text(encoding="utf-8").startswith(f"# {COMPARISON_TITLE}\n")
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours or not set(names) <= set(REPORT_FILES):
        shown = listed(names)
        raise UserError(f"--out {out} holds files no comparison wrote ({shown}); a comparison writes its report only "
                        "into a new folder, an empty one, or an earlier comparison's: choose another --out")
    for name in REPORT_FILES:  # an earlier comparison: each is replaced by the new report
        refuse_to_replace(out / name, overwrite)


def is_finished(run: Run) -> bool:
    """A run is finished when its metrics.jsonl ends with its final record (`RunDir.has_final`: after the final
    scores, or without them when train.final_eval=false)."""
    return RunDir(run.path).has_final()


class _Stop(BaseException):
    """A stop signal, raised once where the sweep is, so that it stops its runs outside the signal handler."""


@dataclass
class Launcher:
    """Starts training processes for runs, at most `parallel` at once, the CPU threads split between them."""

    train_command: tuple[str, ...]  # how to start one training, e.g. (python, "-m", "annotated_transformer", "train")
    config: str
    extra: tuple[str, ...] = ()  # overrides applied to every run, before the setting's own
    parallel: int = 1
    log: Any = print
    running: dict[Run, subprocess.Popen] = field(default_factory=dict)
    starting: bool = False  # inside `start`, where a stop must wait for the run to be known
    stop_due: bool = False  # a stop signal came while `starting`
    files: dict[str, TaskFiles] = field(default_factory=dict)  # by data settings: each corpus opened and hashed once
    done: dict[Path, bool] = field(default_factory=dict)  # `is_done` by run folder: each last.pt read once

    def command(self, run: Run) -> list[str]:
        """The training command of one run."""
        return [*self.train_command, "--config", self.config, *self.overrides(run)]

    def overrides(self, run: Run) -> list[str]:
        """One run's overrides: the sweep's, the setting's, then its seed and run directory, so they win."""
        return [*self.extra, *run.overrides, f"train.seed={run.seed}", f"train.out_dir={run.path}",
                "train.resume=auto", "train.progress=false", "train.score_test=false"]

    def is_done(self, run: Run) -> bool:
        """Whether `run` is finished for this sweep: its final record is there, and the train command would not
        continue it with these settings and files. One whose budget grew is continued, one whose settings or
        data files changed is handed to the train command too, which refuses it in one line in the run's log; a
        finished run without last.pt (deleted to save space) counts as finished, as its final record says, and
        so does one that train.overwrite=true among the sweep's overrides would start again (a sweep started
        again continues, it does not redo what it finished)."""
        if run.path not in self.done:
            self.done[run.path] = self._is_done(run)
        return self.done[run.path]

    def _is_done(self, run: Run) -> bool:
        """`is_done`, read from the run's folder."""
        if not is_finished(run):
            return False
        if not (run.path / "last.pt").is_file():
            return True
        cfg = load_config(self.config, self.overrides(run))
        key = json.dumps([config_to_dict(cfg)["data"], cfg.train.seed], sort_keys=True, default=str)
        files = self.files.setdefault(key, TaskFiles(cfg))  # the runs of a sweep mostly share their data
        try:
            mode, _ = RunDir(run.path).start_mode(cfg, files.resume_check)
        except UserError:
            return False
        return mode != "resume"

    def start(self, run: Run) -> None:
        """Start `run` in the background, its output appended to its log file."""
        pid = run.running_elsewhere()
        if pid is not None:
            raise RunDirError(f"{run.path} is still being trained by process {pid} (from an earlier sweep); wait "
                              f"for it or stop it (kill {pid}), then start the sweep again")
        threads = max(1, usable_cores() // self.parallel)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        with writing(run.log_file, "create the run's folder"):
            run.path.parent.mkdir(parents=True, exist_ok=True)
            output = run.log_file.open("a", encoding="utf-8")
        self.starting = True  # a stop signal now waits until the run is known, so that it is stopped too
        try:
            with output:
                # A session of its own: a Ctrl-C in the terminal reaches the sweep alone, which passes one SIGTERM on.
                self.running[run] = subprocess.Popen(self.command(run), stdout=output, stderr=subprocess.STDOUT,
                                                     env=env, start_new_session=True)
            with writing(run.pid_file):
                atomic_write(run.pid_file, lambda f: f.write(str(self.running[run].pid).encode()))
        finally:
            self.starting = False
        if self.stop_due:
            raise _Stop

    def wait_one(self) -> tuple[Run, int]:
        """Block until a running process ends; its run and exit code."""
        while True:
            for run, proc in list(self.running.items()):
                code = proc.poll()
                if code is not None:
                    del self.running[run]
                    run.pid_file.unlink(missing_ok=True)
                    return run, code
            time.sleep(0.5)

    def stop_all(self, signum: int = signal.SIGTERM) -> None:
        """Pass a signal on to every running process (they save last.pt and exit) and wait for them."""
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signum)
        for run, proc in self.running.items():
            proc.wait()
            run.pid_file.unlink(missing_ok=True)
        self.running.clear()


def run_sweep(runs: list[Run], launcher: Launcher, after_each: Callable[[], None] = lambda: None,
              failed: list[tuple[Run, int]] | None = None) -> list[tuple[Run, int]]:
    """Train every unfinished run, `launcher.parallel` at a time, calling `after_each` when one ends;
    the (run, exit code) of those that failed (appended to `failed` as they fail, when given)."""
    todo = [r for r in runs if not launcher.is_done(r)]
    launcher.log(f"sweep: {len(runs)} runs, {len(runs) - len(todo)} already finished, {len(todo)} to train "
                 f"({launcher.parallel} at a time)")
    failed = [] if failed is None else failed
    queue = list(todo)
    while queue or launcher.running:
        while queue and len(launcher.running) < launcher.parallel:
            run = queue.pop(0)
            launcher.log(f"start {run.setting} seed {run.seed} -> {run.log_file}")
            launcher.start(run)
        run, code = launcher.wait_one()
        if code != 0:
            failed.append((run, code))
            why = (f"stopped by signal {code - 128}" if code > 128 else f"killed by signal {-code}" if code < 0
                   else f"FAILED with exit code {code}")
            launcher.log(f"{why}: {run.setting} seed {run.seed}; its log: {run.log_file}")
        else:
            launcher.log(f"done  {run.setting} seed {run.seed}")
        after_each()
    return failed


def score_test(run: Run, data_root: str | None = None) -> dict[str, Any]:
    """Score a finished run's chosen weights on test (greedy, and beam when its config decodes with a beam)
    with the evaluate command's scorer; the figures go to <run>/test_scores.json."""
    from ..deploy.translator import Translator, chosen_weights
    from ..harness.run_dir import RunDir
    from ..scoring import score_translator

    folder = RunDir(run.path)
    checkpoint = chosen_weights(folder)  # the weights the run's final scores used (best or avg)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    end = final_record(folder.records()) or {}
    scores: dict[str, Any] = {"checkpoint": checkpoint.name, "step": end.get("step")}  # the end it scores
    beams = [1] + ([translator.config.decode.beam_size] if translator.config.decode.beam_size > 1 else [])
    for beam, key in zip(beams, ("greedy", "beam")):
        out = score_translator(translator, str(checkpoint), "test", beam=beam, data_root=data_root,
                               output=str(run.path / f"test.beam{beam}.txt"))
        scores[key], scores[f"{key}_signature"], scores[f"{key}_beam_size"] = out["bleu"], out["signature"], beam
    path = run.path / TEST_SCORES
    with writing(path):
        atomic_write(path, lambda f: f.write(json.dumps(scores, indent=1).encode("utf-8")))
    return scores


def check_settings(config: str, extra: tuple[str, ...], settings: list[tuple[str, ...]], score_tests: bool = False,
                   trains: Callable[[tuple[str, ...]], bool] = lambda overrides: True,
                   log: Callable[[str], None] | None = None) -> tuple[float, bool]:
    """Validate every setting's config before anything runs, and find the data files of each that `trains` (or
    scores test): one line for a bad key or value, or for files that are not there, on which every run would fail;
    the target BLEU, and whether every setting trains the copy task (its report counts exact copies, not BLEU)."""
    from ..data.translation_data import open_corpus

    targets, tasks, found = set(), set(), set()
    for overrides in settings:
        try:
            cfg = load_config(config, [*extra, *overrides])
            data = json.dumps(config_to_dict(cfg)["data"], sort_keys=True, default=str)
            if cfg.data.dataset != "copy" and data not in found and (score_tests or trains(overrides)):
                open_corpus(cfg.data, log=log)  # Multi30k verified (or downloaded), your own files found
                found.add(data)
        except UserError as exc:
            exc.args = (f"setting {_setting_name(overrides)}: {exc}",)  # its kind and details kept
            raise
        if score_tests and cfg.data.dataset == "copy":
            raise ConfigError("--score-test scores BLEU on a test split, which the copy task has not (its runs end "
                              "with their exact copies in metrics.jsonl); leave --score-test out")
        targets.add(cfg.train.target_bleu)
        tasks.add(cfg.data.dataset)
    return max(targets), tasks == {"copy"}


def sweep(config: str, settings: list[tuple[str, ...]], seeds: list[int], out: Path, train_command: tuple[str, ...],
          extra: tuple[str, ...] = (), parallel: int = 1, score_tests: bool = False,
          data_root: str | None = None, log: Callable[[str], None] = print) -> int:
    """Run a sweep (see the module docstring), write its report; 0 when every run finished, else 1."""
    check_out(out)
    runs = grid_runs(settings, seeds, out)
    launcher = Launcher(train_command, config, extra, parallel, log)
    target, copy = check_settings(config, extra, settings, score_tests, log=log,  # as run_sweep will choose them
                                  trains=lambda s: any(not launcher.is_done(r) for r in runs if r.overrides == s))
    with writing(out, "create the sweep's folder"):  # a read-only place is one line before any run starts
        out.mkdir(parents=True, exist_ok=True)

    failed: list[tuple[Run, int]] = []

    def report() -> list[Path]:
        """sweep.md/.csv and the chart: this sweep's runs first, then any others in the folder (earlier grids). A run
        whose training failed here counts as failed, without the figures its folder holds: a refused run's are
        those of the settings it was trained with, not the sweep's."""
        this_grid, gone = {r.path for r in runs}, {run.path for run, _ in failed}
        others = [r for r in collect_results([out]) if out / r.setting / f"seed{r.seed}" not in this_grid]
        mine = [RunResult(r.setting, r.seed, finished=False, failed=True) if r.path in gone
                else read_result(r.path, r.setting, r.seed) for r in runs]
        return write_report(out, mine + others, f"sweep of {config}", target,
                            copy=copy if not others else None)  # others: their results say

    stopped: list[tuple[int, float]] = []  # the stop signal and when it came
    killed: list[bool] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if not stopped:
            stopped.append((signum, time.monotonic()))
            if launcher.starting:  # raised once the run being started is known (`Launcher.start`)
                launcher.stop_due = True
                return
            raise _Stop
        # `timeout -s INT` and uv send a signal twice: one stop; asked again later, the runs are killed, not waited on
        if time.monotonic() - stopped[0][1] > SAME_SIGNAL_SECONDS:
            killed.append(True)
            for proc in list(launcher.running.values()):
                proc.kill()

    previous: dict[int, Any] = {}
    try:
        for s in (signal.SIGTERM, signal.SIGINT):
            previous[s] = signal.signal(s, on_signal)
        run_sweep(runs, launcher, after_each=report, failed=failed)
    except _Stop:  # here, not in the handler: a signal inside it would wait on the runs a second time, forever
        log(f"sweep: signal {stopped[0][0]}, stopping the running trainings (each saves last.pt once it has begun "
            "training; signal again to kill them); start the same command again to continue")
        launcher.stop_all(signal.SIGKILL if killed else signal.SIGTERM)  # killed: the run started meanwhile too
        if killed:
            log("sweep: the running trainings were killed; each continues from its last save")
        report()
        raise SystemExit(128 + stopped[0][0]) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if score_tests:
        gone = {run.path for run, _ in failed}
        for run in (r for r in runs if r.path not in gone):
            end = final_record(RunDir(run.path).records())
            if end is not None and test_scores(run.path, end) is None:  # not scored yet, or an earlier end scored
                log(f"test scores of {run.setting} seed {run.seed}")
                score_test(run, data_root)
    written = report()
    chart = "" if out / "sweep.png" in written else (" (no chart: no run scored val BLEU by epoch; the copy task "
                                                      "has none, and train.bleu_every=0 turns it off)")
    log(f"sweep: {len(runs) - len(failed)}/{len(runs)} runs finished; report in {out / 'sweep.md'}{chart}")
    return 1 if failed else 0
