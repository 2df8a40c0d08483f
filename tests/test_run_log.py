"""train.log: every line a training printed on rank 0, time-stamped in the file only; a resumed run appends to it,
an error that ends a run is in it, and --quiet shortens the terminal but never the log."""

from __future__ import annotations

import errno
import logging
import os
import re

import pytest

from annotated_transformer.runtime.errors import DataError, Terminated
from annotated_transformer.harness import distributed, tasks as tasks_module
from annotated_transformer.harness.distributed import (close_run_log, open_run_log, print0, quiet_terminal,
                                                       result_lines)

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")  # 2026-11-27 19:58:03


def unstamped(path) -> list[str]:
    """train.log's lines without their time stamps; every line must have one."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines and all(STAMP.match(line) for line in lines), lines
    return [STAMP.sub("", line) for line in lines]


@pytest.mark.slow  # two short trainings on Multi30k
def test_train_log_holds_the_terminal_lines_with_times_and_a_resume_appends(tiny_config, multi30k_dir,
                                                                           data_cache_dir, tmp_path, train_command,
                                                                           no_charts):
    run = tmp_path / "run"
    args = ["--config", "tiny.yaml", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
            "train.precision=fp32", f"train.out_dir={run}", "train.device=cpu", "train.progress=false",
            "train.final_eval=false", "train.log_every=2"]
    code, out, err = train_command(*args, "train.max_steps=4")
    assert code == 0, err
    first = unstamped(run / "train.log")
    assert first == out.splitlines()  # what the terminal showed, line for line
    assert not any(STAMP.match(line) for line in out.splitlines())  # the terminal has no time stamps
    assert any(line.startswith("tiny: ") and "parameters | device cpu" in line for line in first)  # the start line
    assert any(line.startswith("epoch 1/1 | step 4/") for line in first)
    assert first[-2].startswith("done in ") and first[-1].startswith("translate with it: ")
    written = (run / "train.log").read_text(encoding="utf-8")

    code, quiet, err = train_command(*args, "train.max_steps=8", "--quiet")  # resumes: the run is not finished
    assert code == 0, err
    log = (run / "train.log").read_text(encoding="utf-8")
    assert log.startswith(written)  # appended, the first run's lines kept
    second = unstamped(run / "train.log")[len(first):]
    resumed = [line for line in second if line.startswith("resumed ")]
    assert resumed == [f"resumed {run / 'last.pt'}: in epoch 1 at step 4"]
    assert any(line.startswith("epoch 1/1 | step 8/") for line in second)
    # --quiet: the terminal shows the run's result alone; train.log still gets every line
    assert quiet.splitlines() == second[-2:] and quiet.splitlines()[0].startswith("done in ")
    assert len(second) > 4


def test_an_error_that_ends_a_run_is_the_last_line_of_its_log(tmp_path, train_command, monkeypatch):
    def broken_data(*args, **kwargs):
        raise DataError("the data went missing; put it back")

    monkeypatch.setattr(tasks_module, "build_task", broken_data)  # after the run directory is made
    code, out, err = train_command("--config", "copy.yaml", f"train.out_dir={tmp_path}", "train.device=cpu",
                                   "train.progress=false")
    assert code == 2 and err == "error: the data went missing; put it back\n"
    assert unstamped(tmp_path / "train.log")[-1] == "error: the data went missing; put it back"
    assert "error:" not in out  # the terminal has it once, on stderr
    print0("after the run")  # the log was closed with the run
    assert "after the run" not in (tmp_path / "train.log").read_text(encoding="utf-8")

    def terminated(*args, **kwargs):  # a SIGTERM met while a file is written (`terminate_raises`), before fit
        raise Terminated

    monkeypatch.setattr(tasks_module, "build_task", terminated)
    code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={tmp_path}", "train.device=cpu",
                                 "train.progress=false")
    assert code == 143 and err == "error: terminated (SIGTERM)\n"
    assert unstamped(tmp_path / "train.log")[-1] == "error: terminated (SIGTERM)"  # it ended the log with no word


def test_quiet_shows_warnings_errors_and_results_and_the_log_gets_all(tmp_path, capsys):
    open_run_log(tmp_path / "train.log")
    try:
        with quiet_terminal():
            print0("loading the data")
            print0("warning: this run will take about 2.4 h")
            distributed.logger.error("error: broken")
            with result_lines():
                print0("test BLEU 30.00")
        print0("not quiet again")
    finally:
        close_run_log()
    assert capsys.readouterr().out.splitlines() == ["warning: this run will take about 2.4 h", "error: broken",
                                                     "test BLEU 30.00", "not quiet again"]
    assert unstamped(tmp_path / "train.log") == ["loading the data", "warning: this run will take about 2.4 h",
                                                 "error: broken", "test BLEU 30.00", "not quiet again"]


def test_a_block_gets_a_stamp_on_every_line_and_the_logger_keeps_to_itself(tmp_path, capsys):
    open_run_log(tmp_path / "train.log")
    try:
        print0("example 0\n  source    Ein Hund.")
    finally:
        close_run_log()
    assert capsys.readouterr().out == "example 0\n  source    Ein Hund.\n"
    assert unstamped(tmp_path / "train.log") == ["example 0", "  source    Ein Hund."]
    assert logging.getLogger("annotated_transformer").propagate is False  # an application's handlers: no copies


class FullDisk:
    """A file on a full disk: every write and flush fails with ENOSPC."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("fails", ["write", "flush"])
def test_a_full_disk_is_one_line_and_the_terminal_keeps_the_log(tmp_path, capsys, fails):
    log = tmp_path / "train.log"
    open_run_log(log)
    try:
        print0("epoch 1/2 | step 1")  # written while there is room
        handler = distributed._RUN_LOG[-1]
        disk = FullDisk()
        if fails == "flush":  # the write reaches a buffer; the disk says no when it is flushed
            disk.write = lambda text: len(text)
        handler.stream = disk
        for step in (2, 3, 4):
            print0(f"epoch 1/2 | step {step}")
    finally:
        close_run_log(DataError("the data went missing"))  # the run's last line: the file gets nothing either
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"warning: cannot write {log}: No space left on device; the log goes on "
                                         "in the terminal only"]
    assert "Traceback" not in captured.err and "--- Logging error ---" not in captured.err
    assert captured.out.splitlines() == [f"epoch 1/2 | step {step}" for step in (1, 2, 3, 4)]
    assert disk.closed and unstamped(log) == ["epoch 1/2 | step 1"]
    print0("the next run's line")  # closed with the run, as always
    assert "next run" not in log.read_text(encoding="utf-8")
