"""How long a run will take: the estimate behind every epoch line, and the early warning of a long run."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch

from annotated_transformer.config import load_config
from annotated_transformer.harness import progress
from annotated_transformer.harness import trainer as trainer_module
from annotated_transformer.harness.progress import (format_duration, quicker_config, run_length, seconds_left,
                                                    slow_run_warning, time_left)
from annotated_transformer.harness.resume import RunCounters
from annotated_transformer.harness.run_end import translate_command
from annotated_transformer.harness.trainer import train_worker
from annotated_transformer.loop import TrainState

QUIET = ["train.progress=false", "train.device=cpu"]
SMALL = ["model.d_model=32", "model.d_ff=64", "model.N=1", "data.copy_batch_size=16"]  # the copy task, smaller


def test_seconds_left_is_the_remaining_steps_at_the_speed_so_far():
    assert seconds_left(100, 1000, 50.0) == pytest.approx(450.0)  # 900 steps at 0.5 s
    assert seconds_left(1000, 1000, 500.0) == 0.0
    assert seconds_left(1200, 1000, 500.0) == 0.0  # never negative
    # resumed at step 500: this process timed 20 steps in 40 s, so 2 s a step for the 500 to come
    assert seconds_left(500, 1000, 40.0, steps_timed=20) == pytest.approx(1000.0)
    assert seconds_left(0, 1000, 0.0) is None and seconds_left(10, 1000, 5.0, steps_timed=0) is None


def test_durations_read_in_seconds_minutes_or_hours():
    assert format_duration(0) == "0 s"
    assert format_duration(45.2) == "45 s"
    assert format_duration(450) == "7.5 min"
    assert format_duration(25 * 60 + 10) == "25 min"
    assert format_duration(8640) == "2.4 h"
    assert format_duration(-3) == "0 s"
    assert format_duration(math.inf) == "?"
    assert [format_duration(x) for x in (59.4, 59.6, 596, 598, 3569, 3571)] == [
        "59 s", "1.0 min", "9.9 min", "10 min", "59 min", "1.0 h"]


def test_the_epoch_line_field_says_how_long_the_rest_takes():
    t = load_config("copy", ["train.epochs=10"]).train
    s, c = TrainState(step=100), RunCounters(epoch=1, wall_seconds=50.0)
    assert time_left(s, c, t, total_steps=1000) == "about 7.5 min left"
    c.epoch, s.step = 10, 1000
    assert time_left(s, c, t, total_steps=1000) == "training done"
    target = load_config("tiny", ["train.target_bleu=30", "train.stop_at_target=true", "train.bleu_every=1",
                                  "train.epochs=10", "train.max_steps=0"]).train
    assert time_left(TrainState(step=100), RunCounters(epoch=1, wall_seconds=50.0), target, 1000) == (
        "at most 7.5 min left")


def test_a_resumed_run_goes_at_its_own_pace(tmp_path, monkeypatch, capsys, no_charts):
    t = load_config("copy", ["train.epochs=10"]).train
    s, c = TrainState(step=200), RunCounters(epoch=1, wall_seconds=550.0, train_seconds=540.0)
    # 100 steps in 495 s of training before the resume (a busier machine), 100 in 45 s since; validation and the
    # rest took 10 s of the run's 200 steps: 800 steps at 0.45 + 0.05 s
    assert time_left(s, c, t, total_steps=1000, since=(100, 495.0)) == "about 6.7 min left"
    assert time_left(s, c, t, total_steps=1000) == "about 37 min left"  # the whole run's pace: 2.75 s a step
    assert time_left(s, c, t, total_steps=1000, since=(200, 540.0)) == "about 37 min left"  # no step of its own yet
    # resumed at step 990, 10 steps in 1 s, then the epoch's validation took 30 s: spread over the run's steps
    s, c = TrainState(step=1000), RunCounters(epoch=1, wall_seconds=131.0, train_seconds=100.0)
    assert time_left(s, c, t, total_steps=2000, since=(990, 99.0)) == "about 2.2 min left"  # 1,000 at 0.1 + 0.031 s

    paces = []
    real = progress.time_left

    def spy(s, c, t, total_steps, wall_seconds=None, since=(0, 0.0), train_seconds=None):
        paces.append((s.step, since))
        return real(s, c, t, total_steps, wall_seconds, since, train_seconds)

    monkeypatch.setattr(progress, "time_left", spy)
    args = [f"train.out_dir={tmp_path}", "train.epochs=1", "data.copy_batches=20", "train.log_every=5",
            "train.final_eval=false", "train.resume=auto", *SMALL, *QUIET]
    train_worker(load_config("copy", [*args, "train.max_steps=10"]))
    assert paces and all(since == (0, 0.0) for _, since in paces)
    paces.clear()
    train_worker(load_config("copy", [*args, "train.max_steps=20"]))  # resumed at step 10
    assert [step for step, _ in paces][:2] == [15, 20] and all(since[0] == 10 and since[1] > 0 for _, since in paces)


def test_the_warning_fires_above_the_threshold_only(monkeypatch):
    kwargs = {"device": "cpu (AMD EPYC, 2 threads)", "length": "20 epochs (1,100 steps)", "tokens_per_s": 1474.4,
              "advice": "for a translator on a CPU in about 12-22 minutes of training use --config cpu_15min.yaml"}
    # 20 steps timed in 160 s, 1,100 steps in all: 1,080 steps at 8 s = 8,640 s = 2.4 h
    left = seconds_left(20, 1100, 160.0)
    assert slow_run_warning(left, **kwargs) == (
        "warning: this run will take about 2.4 h on cpu (AMD EPYC, 2 threads): 20 epochs (1,100 steps) at 1,474 "
        "tokens/s; for a translator on a CPU in about 12-22 minutes of training use --config cpu_15min.yaml")
    # the same speed for 400 steps: 380 x 8 s = 51 min, under the hour
    assert slow_run_warning(seconds_left(20, 400, 160.0), **kwargs) is None
    assert slow_run_warning(None, **kwargs) is None
    assert slow_run_warning(100.0, **kwargs, threshold=99.0) is not None
    monkeypatch.setattr(progress, "SLOW_RUN_SECONDS", 3000.0)  # the default threshold is read at each call
    assert slow_run_warning(seconds_left(20, 400, 160.0), **kwargs) is not None


def test_the_advice_names_the_cpu_config_only_where_it_is_quicker():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    base = load_config("base")
    assert "--config cpu_15min.yaml" in quicker_config(base, cpu)
    assert quicker_config(base, gpu) == ""
    assert quicker_config(load_config("cpu_15min"), cpu) == ""  # no advice to run what already runs
    assert quicker_config(load_config("copy"), cpu) == ""
    assert run_length(load_config("base", ["train.epochs=20"]).train, 1100) == "20 epochs (1,100 steps)"
    assert run_length(load_config("tiny").train, 200) == "200 steps (train.max_steps)"


def test_a_run_prints_the_time_left_on_every_epoch_line_and_the_warning_once(tmp_path, monkeypatch, capsys,
                                                                              no_charts):
    # A threshold of 0 s: any run is "long", so the warning shows on this seconds-long run.
    monkeypatch.setattr(progress, "SLOW_RUN_SECONDS", 0.0)
    monkeypatch.setattr(progress, "SPEED_AFTER_STEPS", 5)
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=3", "data.copy_batches=10",
                               "train.log_every=5", "train.final_eval=false", *SMALL, *QUIET])
    train_worker(cfg)
    lines = capsys.readouterr().out.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 3
    assert all(re.search(r" \| about [0-9.]+ (s|min|h) left$", line) for line in epochs[:2]), epochs
    assert epochs[2].endswith(" | training done")
    warnings = [i for i, line in enumerate(lines) if line.startswith("warning: this run will take")]
    assert len(warnings) == 1, lines
    line = lines[warnings[0]]
    assert re.fullmatch(r"warning: this run will take about [0-9.]+ (s|min|h) on cpu \(.+, \d+ threads\): "
                        r"3 epochs \(30 steps\) at [0-9,]+ tokens/s", line), line  # no advice for the copy task
    # at the first log line with 5 steps timed, before the first epoch's line
    assert lines[warnings[0] - 1].startswith("step      5 |") and warnings[0] < lines.index(epochs[0])


def test_a_quick_run_does_not_warn(tmp_path, capsys, no_charts):
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=10",
                               "train.log_every=5", "train.final_eval=false", *SMALL, *QUIET])
    train_worker(cfg)
    out = capsys.readouterr().out
    assert "epoch 1/2" in out and " left" in out and "warning: this run will take" not in out


@pytest.fixture()
def looks(monkeypatch):
    """Every look of the trainer at its speed: (at an epoch's end, step, warned)."""
    seen = []

    def looking(tr, at_epoch_end):
        line = progress.speed_warning(tr, at_epoch_end)
        seen.append((at_epoch_end, tr.train_state.step, line is not None))
        return line

    monkeypatch.setattr(trainer_module, "speed_warning", looking)
    return seen


def test_without_log_lines_the_first_epoch_end_decides(tmp_path, monkeypatch, capsys, no_charts, looks):
    monkeypatch.setattr(progress, "SLOW_RUN_SECONDS", 0.0)
    monkeypatch.setattr(progress, "SPEED_AFTER_SECONDS", 1e9)  # no look between log lines
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=4",
                               "train.log_every=100", "train.final_eval=false", *SMALL, *QUIET])
    train_worker(cfg)
    assert looks == [(True, 4, True)]
    lines = capsys.readouterr().out.splitlines()
    warning = [i for i, line in enumerate(lines) if line.startswith("warning: this run will take")]
    assert len(warning) == 1 and lines[warning[0] + 1].startswith("epoch 1/2 |"), lines


def test_slow_steps_between_log_lines_are_looked_at_after_a_while(tmp_path, monkeypatch, capsys, no_charts, looks):
    monkeypatch.setattr(progress, "SLOW_RUN_SECONDS", 0.0)
    monkeypatch.setattr(progress, "SPEED_AFTER_SECONDS", 0.0)  # "a minute" has passed after every step
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=6",
                               "train.log_every=100", "train.final_eval=false", *SMALL, *QUIET])
    train_worker(cfg)
    # too few steps to trust at steps 1 and 2 (SPEED_MIN_STEPS); the look at step 3 warns, and that settles it
    assert looks == [(False, 1, False), (False, 2, False), (False, 3, True)]
    assert capsys.readouterr().out.count("warning: this run will take") == 1


@pytest.mark.parametrize("argv0, uv, expected", [
    ("scripts/train.py", "/usr/bin/uv", "uv run python scripts/translate.py --checkpoint runs/x/avg.pt"),
    ("scripts/train.py", None, "python scripts/translate.py --checkpoint runs/x/avg.pt"),
    ("/venv/bin/annotated-transformer", "/usr/bin/uv", "uv run annotated-transformer translate --checkpoint "
     "runs/x/avg.pt"),
    ("/venv/bin/annotated-transformer", None, "annotated-transformer translate --checkpoint runs/x/avg.pt"),
    ("/venv/lib/annotated_transformer/__main__.py", None, "python -m annotated_transformer translate --checkpoint "
     "runs/x/avg.pt"),
])
def test_the_last_line_is_a_translate_command_spelt_as_training_was_started(monkeypatch, argv0, uv, expected):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # scripts/translate.py is there
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys, "prefix", str(root / ".venv"))  # the project's environment, as `uv run` gives
    if uv:
        monkeypatch.setenv("UV", uv)
    else:
        monkeypatch.delenv("UV", raising=False)
    assert translate_command(root / "runs" / "x" / "avg.pt") == expected
    assert translate_command(Path("/elsewhere/best.pt")).endswith("--checkpoint /elsewhere/best.pt")


def test_the_translate_command_names_the_project_where_uv_needs_it(monkeypatch, tmp_path):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/annotated-transformer"])
    monkeypatch.setenv("UV", "/usr/bin/uv")
    monkeypatch.setattr(sys, "prefix", str(root / ".venv"))
    monkeypatch.chdir(tmp_path)  # uv run --project ROOT from the corpus's folder
    assert translate_command(tmp_path / "run" / "best.safetensors") == (
        f"uv run --project {root} annotated-transformer translate --checkpoint run/best.safetensors")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "tools" / "annotated-transformer"))  # uvx: no project
    assert translate_command(tmp_path / "run" / "best.safetensors") == (
        "annotated-transformer translate --checkpoint run/best.safetensors")


# ---------------------------------------------------------------- a CPU shared with other processes


def test_the_shared_cpu_warning_judges_each_threads_share_of_a_core(monkeypatch):
    # measured on a 2-core VM: alone 1.96-1.98 cores for 2 threads (1.65 with OMP_WAIT_POLICY=PASSIVE); two at once 1.0
    assert progress.shared_cpu_warning(19.8, 10.0, threads=2, cores=2) is None
    assert progress.shared_cpu_warning(16.5, 10.0, threads=2, cores=2) is None
    assert progress.shared_cpu_warning(15.0, 15.0, threads=2, cores=2) == (
        "warning: training's 2 threads got 1.0 core of CPU time over the last 15 s of steps; other programs on these "
        "2 cores can slow steps several times: stop them, or give each program its own cores (e.g. "
        "OMP_NUM_THREADS=1 for this training) (docs/performance.md#sharing-the-cpu)")
    assert progress.shared_cpu_warning(5.0, 9.9, threads=2, cores=2) is None  # too short a stretch to judge
    assert progress.shared_cpu_warning(5.0, 10.0, threads=1, cores=2) is None  # one thread waits for nobody
    assert progress.shared_cpu_warning(150.0, 10.0, threads=16, cores=16) is None
    assert "got 8.0 cores of CPU time" in progress.shared_cpu_warning(80.0, 10.0, threads=16, cores=16)
    assert "OMP_NUM_THREADS=8 for this training" in progress.shared_cpu_warning(80.0, 10.0, threads=16, cores=16)
    fewer = progress.shared_cpu_warning(10.0, 10.0, threads=4, cores=16)  # never advice of more threads
    assert "OMP_NUM_THREADS=1 for this training" in fewer
    more = progress.shared_cpu_warning(20.0, 10.0, threads=8, cores=2)  # more threads than cores: its own doing
    assert "more threads than the 2 cores can slow steps several times: set OMP_NUM_THREADS=2 or fewer" in more
    monkeypatch.setattr(progress, "CPU_SHARE_MIN", 0.4)  # the threshold is read at each call
    assert progress.shared_cpu_warning(15.0, 15.0, threads=2, cores=2) is None


def test_the_usable_cores_are_the_affinity_masks_or_the_machines(monkeypatch):
    from annotated_transformer.runtime import device

    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert device.usable_cores() == 3
    monkeypatch.delattr(device.os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(device.os, "cpu_count", lambda: 6)
    assert device.usable_cores() == 6


class FakeClocks:
    """progress.cpu_clocks of a process whose threads get `cores` cores' time: each read is a second later."""

    def __init__(self, cores: float) -> None:
        self.cores, self.cpu, self.wall = cores, 0.0, 0.0

    def __call__(self) -> tuple[float, float]:
        self.cpu, self.wall = self.cpu + self.cores, self.wall + 1.0
        return self.cpu, self.wall

    def idle(self, seconds: float) -> None:
        """Time that takes no CPU (a validation waiting for its data, say)."""
        self.wall += seconds


@pytest.mark.parametrize("threads, validate, warned", [
    (2, 0, False),  # 2 cores' time for 2 threads
    (3, 0, True),  # 2 for 3 threads: 0.67 of a core each, under the cut of 0.75 set below
    (2, 2, False),  # validations every 2 steps, each 100 s without CPU: not steps, not judged
    (3, 2, True),  # stretches of 2 steps, shorter than a judgement: added up across the validations
])
def test_a_cpu_run_whose_threads_get_too_little_of_a_core_says_so_once(tmp_path, monkeypatch, capsys, no_charts,
                                                                        threads, validate, warned):
    clocks = FakeClocks(2.0)
    monkeypatch.setattr(progress, "cpu_clocks", clocks)
    monkeypatch.setattr(progress, "CPU_SHARE_SECONDS", 6.0)
    monkeypatch.setattr(progress, "CPU_SHARE_MIN", 0.75)
    monkeypatch.setattr(progress.torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(progress, "usable_cores", lambda: 4)
    evaluate = trainer_module.Trainer.evaluate

    def slow_evaluate(self, *args, **kwargs):
        clocks.idle(100.0)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module.Trainer, "evaluate", slow_evaluate)
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=10",
                               f"train.val_every_steps={validate}", "train.log_every=5", "train.final_eval=false",
                               *SMALL, *QUIET])
    train_worker(cfg)
    lines = capsys.readouterr().out.splitlines()
    found = [line for line in lines if line.startswith("warning: training's")]
    assert sum(line.startswith("epoch ") for line in lines) == 2, lines
    if not warned:
        assert found == [], found
        return
    assert len(found) == 1, found  # once a run
    assert found[0].startswith("warning: training's 3 threads got 2.0 cores of CPU time over the last ")
    assert "(e.g. OMP_NUM_THREADS=2 for this training)" in found[0]  # the cores it got
