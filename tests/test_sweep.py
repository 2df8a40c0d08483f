"""scripts/sweep.py: grids, the runs it lists, the figures it reports, and a real sweep killed and restarted."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from annotated_transformer.runtime.errors import ConfigError, DataError
from annotated_transformer.checkpoints import load_checkpoint
from annotated_transformer.harness.run_dir import read_metrics
from annotated_transformer.lab.sweep import Launcher, Run, check_settings, grid_runs, is_finished, parse_grid, read_grid
from annotated_transformer.lab.seed_statistics import RunResult, curve_points, mean_sd, read_result, summary_markdown



def test_a_mapping_grid_is_the_product_of_its_lists():
    settings = parse_grid({"train.lr_factor": [0.5, 1.0], "model.dropout": [0.1, 0.3], "train.epochs": 4})
    assert len(settings) == 4
    assert ("train.lr_factor=0.5", "model.dropout=0.3", "train.epochs=4") in settings


def test_a_list_grid_is_one_setting_per_mapping_and_keeps_list_values():
    settings = parse_grid([{"train.adam_betas": [0.9, 0.99]}, {"train.warmup": 100, "train.compile": True}])
    assert settings == [("train.adam_betas=[0.9,0.99]",), ("train.warmup=100", "train.compile=true")]


@pytest.mark.parametrize("grid, message", [
    ({"epochs": [1, 2]}, "expected a mapping of dotted keys"),  # not a dotted key
    ([3], "expected a mapping of dotted keys"),
    ("train.epochs", "expected a mapping of dotted keys"),
    ([{"train.epochs": 1}, {"train.epochs": 1}], "the same setting appears twice"),
    ([], "no settings"),
    ({"train.epochs": []}, "no settings"),
])
def test_malformed_grids_are_one_line_errors(grid, message):
    with pytest.raises(ConfigError, match=f"^grid: {message}"):
        parse_grid(grid)


def test_grid_files_that_are_missing_or_not_yaml_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the grid"):
        read_grid(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train.epochs: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_grid(bad)
    bad.write_text("train.epochs: [1, 2]\ntrain.epochs: [3]\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(the key 'train.epochs' is given twice"):
        read_grid(bad)


def test_every_setting_is_validated_before_anything_runs():
    with pytest.raises(ConfigError, match="setting train.lr_factr=2"):
        check_settings("tiny", (), [("train.lr_factor=1",), ("train.lr_factr=2",)])
    assert check_settings("tiny", ("train.bleu_every=1",), [("train.target_bleu=3",), ()]) == (3, False)
    with pytest.raises(ConfigError, match="--score-test scores BLEU on a test split, which the copy task has not"):
        check_settings("copy", (), [()], score_tests=True)  # its runs would all train, then fail at the end
    assert check_settings("copy", (), [()]) == (0, True)


def test_runs_are_listed_setting_by_setting_with_their_own_folders(tmp_path):
    runs = grid_runs([("train.lr_factor=1",), ()], [1, 2], tmp_path)
    assert [(r.setting, r.seed) for r in runs] == [("train.lr_factor=1", 1), ("train.lr_factor=1", 2),
                                                    ("base", 1), ("base", 2)]
    assert runs[1].path == tmp_path / "train.lr_factor=1" / "seed2"
    assert runs[1].log_file == tmp_path / "train.lr_factor=1" / "seed2.log"


def test_the_seed_and_run_folder_come_last_so_they_win(tmp_path):
    run = Run("s", ("train.seed=9", "train.out_dir=elsewhere"), 3, tmp_path / "s" / "seed3")
    cmd = Launcher(("python", "train.py"), "tiny", ("train.epochs=1",)).command(run)
    seeds = [a for a in cmd if a.startswith("train.seed=")]
    dirs = [a for a in cmd if a.startswith("train.out_dir=")]
    assert seeds[-1] == "train.seed=3" and dirs[-1] == f"train.out_dir={run.path}"
    assert "train.resume=auto" in cmd and "train.score_test=false" in cmd


def test_mean_and_sample_sd_skip_missing_values():
    mean, sd, n = mean_sd([30.0, None, 32.0, 34.0])
    assert (mean, n) == (32.0, 3) and sd == pytest.approx(2.0)
    assert mean_sd([None]) == (None, None, 0)
    assert mean_sd([5.0])[1] is None


def _result(setting, seed, bleu, target=None, curve=()):
    return RunResult(setting, seed, True, epochs=len(curve), steps=100, params=1_000_000, val_bleu=bleu,
                     train_seconds=600.0, target_seconds=target, tokens_per_s=5000.0, curve=curve)


def test_summary_has_one_row_per_setting_with_mean_sd_and_time_to_target():
    results = [_result("a", 1, 30.0, 120.0), _result("a", 2, 32.0, 240.0), _result("a", 3, 34.0, None),
               _result("b", 1, 20.0)]
    text = summary_markdown(results, "t", 31.0)
    row_a = next(line for line in text.splitlines() if line.startswith("| `a`"))
    row_b = next(line for line in text.splitlines() if line.startswith("| `b`"))
    assert "32.00 +/- 2.00 (n=3)" in row_a and "3/3" in row_a
    assert "3.0 min [2.0-4.0] (2/3)" in row_a  # median of 2 and 4 minutes, over the runs that reached it
    assert "not reached (0/1)" in row_b and "20.00 (n=1)" in row_b
    no_target = next(line for line in summary_markdown([_result("b", 1, 20.0)], "t", 0.0).splitlines()
                     if line.startswith("| `b`"))
    assert "not reached" not in no_target and "| 20.00 (n=1) | - | - | - | - |" in no_target  # no target: none to reach


def test_the_mean_curve_averages_the_seeds_epoch_by_epoch():
    results = [_result("a", 1, 0, curve=((1.0, 10.0), (2.0, 20.0))), _result("a", 2, 0, curve=((3.0, 14.0),))]
    means = [p for p in curve_points(results) if p["kind"] == "mean"]
    assert [(p["minutes"], p["bleu"]) for p in means] == [(2.0, 12.0), (2.0, 20.0)]
    assert len([p for p in curve_points(results) if p["kind"] == "run"]) == 3


def test_a_copy_task_sweep_reports_exact_copies_and_val_loss_not_bleu(tmp_path):
    from annotated_transformer.lab.seed_statistics import collect_results, results_csv

    for seed, copies, loss in ((1, 90, 0.25), (2, 94, 0.75)):
        run = tmp_path / "base" / f"seed{seed}"
        run.mkdir(parents=True)
        lines = [{"kind": "epoch", "epoch": 1, "step": 10, "val_loss": loss, "train_seconds": 60.0},
                 {"kind": "final", "step": 10, "checkpoint": "best.safetensors", "exact_copies": copies}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    results = collect_results([tmp_path])
    table = summary_markdown(results, "t", 0.0)
    header, row = (line for line in table.splitlines() if line.startswith("| s") or line.startswith("| `base`"))
    assert "exact copies (of 100)" in header and "BLEU" not in table and "target" not in table
    assert "| 2/2 | 92.0 +/- 2.8 (n=2) | 0.5000 +/- 0.3536 (n=2) |" in row
    assert "BLEU" in summary_markdown(results, "t", 0.0, copy=False)  # a sweep of translation says so itself
    rows = list(csv.DictReader(io.StringIO(results_csv(results))))
    assert [(r["exact_copies"], r["val_loss"]) for r in rows] == [("90", "0.25"), ("94", "0.75")]


def test_a_run_continued_after_its_end_is_not_finished_until_it_ends_again(tmp_path):
    """A finished run given a larger budget and stopped before its new end: its old final record does not make it
    finished (the sweep skipped it, and reported the old end's figures)."""
    from annotated_transformer.harness.run_dir import final_record

    ended = [{"kind": "start", "step": 0}, {"kind": "epoch", "epoch": 1, "step": 5},
             {"kind": "final", "step": 5, "val_bleu": 10.0}]
    assert final_record(ended) == ended[-1]
    continued = [*ended, {"kind": "start", "step": 5}, {"kind": "train", "step": 6}, {"kind": "epoch", "step": 10}]
    assert final_record(continued) is None and final_record([]) is None
    assert final_record([*continued, {"kind": "final", "step": 10}]) == {"kind": "final", "step": 10}
    run = tmp_path / "base" / "seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in continued))
    (run / "test_scores.json").write_text(json.dumps({"greedy": 30.0, "step": 5}))  # the old end's test scores
    result = read_result(run, "base", 1)
    assert not is_finished(Run("base", (), 1, run)) and not result.finished and result.test_bleu is None
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*continued, {"kind": "final",
                                                                                           "step": 10}]))
    assert read_result(run, "base", 1).test_bleu is None  # ended anew: scored anew, not the old end's figure
    (run / "test_scores.json").write_text(json.dumps({"greedy": 31.0, "step": 10}))
    assert read_result(run, "base", 1).test_bleu == 31.0


def test_read_result_of_a_folder_without_metrics_is_unfinished(tmp_path):
    result = read_result(tmp_path, "a", 1)
    assert not result.finished and result.val_bleu is None and result.curve == ()


HOLD_AT, MAX_STEPS = 5, 30  # the first sweep's runs hold after step HOLD_AT; every run trains MAX_STEPS steps

# The sweep's train command with two changes: no charts at a run's end (seconds each in a fresh process;
# test_copy_task.py checks them), and where $HOLD_AT is set, each run writes <run>.held after that optimizer step
# and waits for the signal the sweep passes on; so the sweep is killed while each run it started is inside its
# training, at a known step.
QUICK_TRAIN = textwrap.dedent("""
    import os, sys, time
    from annotated_transformer.cli import main
    from annotated_transformer.harness import run_end
    from annotated_transformer.harness.tasks import TranslationTask
    from annotated_transformer.harness.trainer import Trainer

    run_end.write_charts = lambda run, log: None
    hold_at = int(os.environ.get("HOLD_AT", "0"))
    real_should_stop = Trainer._should_stop

    def should_stop(self):
        if self.train_state.step == hold_at:
            self.run.path.with_name(self.run.path.name + ".held").write_text("held")
            while self.stopper.signum is None:
                time.sleep(0.05)
        return real_should_stop(self)

    Trainer._should_stop = should_stop

    # Validation BLEU one point above the model's: a short run's can be exactly 0 on one CPU kind and not on
    # another, and the sweep's bookkeeping of the target is what is tested (test scores stay as scored).
    real_score = TranslationTask.score

    def score(self, model, device, split="val", *args, **kwargs):
        scored = real_score(self, model, device, split, *args, **kwargs)
        return {**scored, "bleu": scored["bleu"] + 1.0} if split == "val" else scored

    TranslationTask.score = score
    main(["train", *sys.argv[1:]])
""")
SWEEP = textwrap.dedent(f"""
    import sys
    from annotated_transformer.cli import main, sweep

    sweep.TRAIN_COMMAND = (sys.executable, "-c", {QUICK_TRAIN!r})
    main(["sweep", *sys.argv[1:]])
""")


# A training that ignores the SIGTERM the sweep passes on (a run stuck in a long step), saying when it has started.
STUCK_TRAIN = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("started", flush=True)
    time.sleep(600)
""")


@pytest.mark.slow  # a second Python process
def test_a_second_stop_signal_later_kills_the_runs_a_sweep_waits_on(tmp_path):
    """Ctrl-C stops a sweep by passing SIGTERM to its runs and waiting for them to save; asked again a second or
    more later, it kills them (it waited for ever on a run that did not stop)."""
    script = ("import sys\nfrom annotated_transformer.cli import main, sweep\n"
              f"sweep.TRAIN_COMMAND = (sys.executable, '-c', {STUCK_TRAIN!r})\nmain(['sweep', *sys.argv[1:]])\n")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-c", script, "--config", "copy", "--seeds", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = out / "base" / "seed1.log"
        deadline = time.monotonic() + 120
        while not (log.is_file() and "started" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        run_pid = int((out / "base" / "seed1.pid").read_text())
        proc.send_signal(signal.SIGINT)
        time.sleep(2.0)  # more than a second: asked again
        assert proc.poll() is None  # still waiting on the run, which ignores the SIGTERM
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, output
    assert "the running trainings were killed; each continues from its last save" in output
    with pytest.raises(ProcessLookupError):
        os.kill(run_pid, 0)  # gone (reaped by the sweep)


def _sweep_args(out: Path, grid: Path, multi30k_dir: Path, cache: Path, parallel: int = 2) -> list[str]:
    """One seed of each setting, `parallel` runs at a time, each a short tiny.yaml run on sentences of up to 10
    tokens."""
    return ["--config", "tiny", "--grid", str(grid), "--seeds", "1", "--parallel", str(parallel), "--out", str(out),
            f"data.root={multi30k_dir}", f"data.cache_dir={cache}", "data.max_sentence_len=10",
            "data.long_policy=skip", f"train.max_steps={MAX_STEPS}", "train.warmup=10", "train.log_every=5",
            "train.bleu_every=1", "train.target_bleu=0.000001", "decode.max_len_a=5", "train.device=cpu",
            "train.precision=fp32"]  # a val BLEU above 0 after one short epoch: fp32 on every CPU kind


@pytest.mark.slow
def test_a_sweep_killed_midway_continues_where_it_stopped(tmp_path, multi30k_dir, data_cache_dir, tiny_config,
                                                          word_mode_scores, capsys):
    from annotated_transformer.cli import run as run_command
    from annotated_transformer.data import load_translation_data

    load_translation_data(tiny_config(), log=None)  # the word-level cache, built once before the runs share it
    grid = tmp_path / "grid.yaml"
    grid.write_text("train.lr_factor: [1.0, 0.5, 2.0]\n")
    out = tmp_path / "sweep"
    args = _sweep_args(out, grid, multi30k_dir, data_cache_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HOLD_AT", None)
    first_pair = [out / f"train.lr_factor={lr}" / "seed1" for lr in ("1.0", "0.5")]  # the two runs started first
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, *args], env={**env, "HOLD_AT": str(HOLD_AT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The handshake: both runs hold at step HOLD_AT (a failed sweep ends instead, and fails the test below;
        # the deadline only keeps a broken sweep from hanging the suite).
        deadline = time.monotonic() + 300
        while proc.poll() is None and not all(run.with_name(run.name + ".held").is_file() for run in first_pair):
            assert time.monotonic() < deadline, "the sweep's first two runs never reached their step"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # twice, as `timeout -s INT` under uv sends it: one stop (it hung)
        time.sleep(0.1)  # the runs take longer than this to save and end
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, output
    assert output.count("sweep: signal") == 1, output
    assert "start the same command again to continue" in output
    for run in first_pair:  # each stopped at the step where the signal reached it, and saved last.pt there
        assert max(r["step"] for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "train") == HOLD_AT
        assert load_checkpoint(run / "last.pt")["train_state"]["step"] == HOLD_AT
    assert not (out / "train.lr_factor=2.0").exists()  # the third setting never started

    # the same sweep again (its runs hold nowhere), all three runs at once (a sweep's width is not a setting of
    # its runs), scoring test at the end
    again = subprocess.run([sys.executable, "-c", SWEEP, *_sweep_args(out, grid, multi30k_dir, data_cache_dir, 3),
                            "--score-test"], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 runs, 0 already finished, 3 to train" in again.stdout
    for run in first_pair:
        log = run.with_name(f"{run.name}.log").read_text()
        assert f"resumed {run / 'last.pt'}: in epoch 1 at step {HOLD_AT}" in log
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert sorted((r["setting"], r["seed"]) for r in rows) == [(f"train.lr_factor={lr}", "1")
                                                               for lr in ("0.5", "1.0", "2.0")]
    for row in rows:
        assert row["finished"] == "True" and row["steps"] == str(MAX_STEPS)
        run = out / row["setting"] / f"seed{row['seed']}"
        hyps = (run / "test.beam1.txt").read_text(encoding="utf-8").split("\n")[:-1]
        assert len(hyps) == 1000
        assert float(row["test_bleu"]) == pytest.approx(word_mode_scores(hyps, "test")["bleu_lc"], abs=1e-6)
        (epoch,) = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "epoch"]
        assert epoch["target_epoch"] == 1 and float(row["target_seconds"]) == pytest.approx(epoch["target_seconds"])
        assert epoch["target_seconds"] > 0
    table = (out / "sweep.md").read_text()
    assert table.count("| 1/1 |") == 3 and "(1/1)" in table
    assert (out / "sweep.png").stat().st_size > 1000 and (out / "sweep.html").is_file()

    with pytest.raises(SystemExit) as third:  # the same command once more, in this process: nothing left to train
        run_command("sweep", args, "sweep.py")
    assert third.value.code == 0 and "3 runs, 3 already finished, 0 to train" in capsys.readouterr().out

    # A finished run counts as done only for the settings it was trained with: a grown budget continues it, a
    # changed model is handed to the train command (which refuses it in the run's log), as train.py alone does.
    extra = tuple(args[args.index("--out") + 2:])
    run = grid_runs([("train.lr_factor=1.0",)], [1], out)[0]
    assert Launcher(("train.py",), "tiny", extra).is_done(run)
    assert not Launcher(("train.py",), "tiny", (*extra, f"train.max_steps={MAX_STEPS + 10}")).is_done(run)
    assert not Launcher(("train.py",), "tiny", (*extra, "model.d_model=32")).is_done(run)
    assert Launcher(("train.py",), "tiny", (*extra, "train.overwrite=true")).is_done(run)  # a restart redoes nothing

    # data moved away: the finished runs would go on to the train command, which cannot find it; said once, before
    # any run starts (the check took every finished run for done, whatever the train command would make of it)
    before = (run.path / "metrics.jsonl").read_bytes()
    with pytest.raises(SystemExit) as moved:
        run_command("sweep", [*args, f"data.root={tmp_path / 'moved'}"], "sweep.py")
    err = capsys.readouterr().err
    assert moved.value.code == 2 and err.startswith("error: setting train.lr_factor=1.0: data.root points at "), err
    assert (run.path / "metrics.jsonl").read_bytes() == before


def _fake_run(folder: Path, setting: str, seed: int, bleus: list[float]) -> None:
    run = folder / setting / f"seed{seed}"
    run.mkdir(parents=True)
    lines = [{"kind": "start", "step": 0, "params": 123}]
    lines += [{"kind": "epoch", "epoch": i + 1, "step": 10 * (i + 1), "bleu": b, "train_seconds": 60.0 * (i + 1)}
              for i, b in enumerate(bleus)]
    lines.append({"kind": "final", "step": 10 * len(bleus), "val_bleu": max(bleus)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_compare_reports_the_runs_of_several_sweep_folders(tmp_path, capsys):
    from annotated_transformer.cli import run as run_command

    _fake_run(tmp_path / "fast", "base", 1, [10.0, 20.0])
    _fake_run(tmp_path / "fast", "base", 2, [12.0, 22.0])
    _fake_run(tmp_path / "slow", "x=1", 1, [5.0, 8.0, 11.0])
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as done:  # the sweep command, in this process
        run_command("sweep", ["--compare", str(tmp_path / "fast"), str(tmp_path / "slow"), "--out", str(out)],
                    "sweep.py")
    assert done.value.code == 0, capsys.readouterr().err
    table = (out / "sweep.md").read_text()
    assert "| `fast: base` | 2/2 | 21.00 +/- 1.41 (n=2)" in table and "| `slow: x=1` | 1/1 | 11.00 (n=1)" in table
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    again = ["--compare", str(tmp_path / "fast"), "--out", str(out)]  # an earlier comparison's report is kept ...
    with pytest.raises(SystemExit) as refused:
        run_command("sweep", again, "sweep.py")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"{out / 'sweep.md'} already exists" in err and err.count("\n") == 1
    assert "| `slow: x=1` |" in (out / "sweep.md").read_text()
    with pytest.raises(SystemExit) as replaced:  # ... unless --overwrite
        run_command("sweep", [*again, "--overwrite"], "sweep.py")
    assert replaced.value.code == 0 and "| `slow: x=1` |" not in (out / "sweep.md").read_text()
    mine = tmp_path / "notes"  # a report file of the user's, whichever of the four names it has, is kept, and a
    mine.mkdir()               # folder of other files gets no report (both were written into, with --overwrite)
    (mine / "sweep.csv").write_text("my,table\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.de").write_text("Ein Hund.\n")
    for folder in (mine, tmp_path / "corpus"):
        for extra in ([], ["--overwrite"]):
            with pytest.raises(SystemExit) as kept:
                run_command("sweep", ["--compare", str(tmp_path / "fast"), "--out", str(folder), *extra], "sweep.py")
            err = capsys.readouterr().err
            assert kept.value.code == 2 and f"--out {folder} holds files no comparison wrote" in err, err
    assert sorted(p.name for p in mine.iterdir()) == ["sweep.csv"]
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["train.de"]
    with pytest.raises(SystemExit) as own:  # never into a compared folder, whose report it would replace
        run_command("sweep", ["--compare", str(tmp_path / "fast"), "--out", str(tmp_path / "fast"), "--overwrite"],
                    "sweep.py")
    err = capsys.readouterr().err
    assert own.value.code == 2 and "is one of the --compare folders" in err
    with pytest.raises(SystemExit) as empty:
        run_command("sweep", ["--compare", str(out), "--out", str(tmp_path / "cmp2")], "sweep.py")
    err = capsys.readouterr().err
    assert empty.value.code == 2 and err.startswith("error: ") and "no runs found" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as missing:  # a folder that is not there is named, not left out of the report
        run_command("sweep", ["--compare", f"{tmp_path / 'fast'},{tmp_path / 'nosuch'}", "--out", str(tmp_path / "c3")],
                    "sweep.py")
    err = capsys.readouterr().err
    assert missing.value.code == 2 and err == f"error: --compare {tmp_path / 'nosuch'} is not a folder; give the " \
        "folders that scripts/sweep.py wrote (its --out)\n"
    assert not (tmp_path / "c3").exists()
    with pytest.raises(SystemExit) as zero:
        run_command("sweep", ["--config", "tiny", "--seeds", "1", "--parallel", "0"], "sweep.py")
    assert zero.value.code == 2 and capsys.readouterr().err == "error: --parallel must be at least 1, got 0\n"
    with pytest.raises(SystemExit) as both:
        run_command("sweep", ["--config", "tiny", "--seeds", "2", "--seed-list", "1"], "sweep.py")
    assert both.value.code == 2 and "--seeds and --seed-list both name the seeds" in capsys.readouterr().err


def test_a_training_sweep_writes_only_into_a_new_folder_or_an_earlier_sweeps(tmp_path, capsys):
    """--out of the user's files (or a file) is refused before any training; an earlier sweep's folder is not."""
    from annotated_transformer.cli import run as run_command
    from annotated_transformer.lab.sweep import check_out

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "sweep.md").write_text("# my plans\n")
    (notes / "todo.txt").write_text("read the paper\n")
    for out in (notes, notes / "todo.txt"):
        with pytest.raises(SystemExit) as refused:
            run_command("sweep", ["--config", "copy", "--seeds", "1", "--out", str(out)], "sweep.py")
        err = capsys.readouterr().err
        assert refused.value.code == 2 and err.startswith("error: --out ") and err.count("\n") == 1, err
        assert ("holds files no sweep wrote (sweep.md, todo.txt)" in err) == (out == notes)
    assert sorted(p.name for p in notes.iterdir()) == ["sweep.md", "todo.txt"]
    assert (notes / "sweep.md").read_text() == "# my plans\n"
    earlier = tmp_path / "sweep"
    _fake_run(earlier, "base", 1, [10.0])
    (earlier / "sweep.md").write_text("an earlier report\n")
    check_out(earlier)  # an earlier sweep's folder: continued
    check_out(tmp_path / "new")  # a new one
    started = tmp_path / "started"  # a sweep killed before its first run wrote anything but its log
    (started / "base").mkdir(parents=True)
    (started / "base" / "seed1.log").write_text("")
    check_out(started)


def test_a_sweep_folder_that_cannot_be_made_is_one_line_before_any_run(tmp_path, capsys, monkeypatch):
    """A read-only place for --out: said of the sweep's folder, before a run starts (a run was announced, then the
    error named the sweep's folder as a run's)."""
    import errno

    from annotated_transformer.cli import run as run_command

    out = tmp_path / "ro" / "new"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if out.is_relative_to(self):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(SystemExit) as refused:
        run_command("sweep", ["--config", "copy", "--seeds", "1", "--out", str(out)], "sweep.py")
    stdout, err = capsys.readouterr()
    assert refused.value.code == 2 and err.startswith(f"error: cannot create the sweep's folder {out}"), err
    assert "start" not in stdout and not (tmp_path / "ro").exists()


def test_data_that_is_not_there_is_one_line_before_any_run(tmp_path, capsys):
    """Every run would fail on it (and a finished run be reported failed): the sweep says so once, runs nothing."""
    from annotated_transformer.cli import run as run_command

    out = tmp_path / "sw"
    for data in (f"data.root={tmp_path / 'nope'}", f"data.train={tmp_path / 'corpus' / 'train'}"):
        extra = [] if data.startswith("data.root") else ["data.dataset=files", "data.src_lang=de", "data.tgt_lang=en",
                                                          f"data.val={tmp_path / 'corpus' / 'val'}"]
        with pytest.raises(SystemExit) as refused:
            run_command("sweep", ["--config", "tiny", "--seeds", "1", "--out", str(out), data, *extra], "sweep.py")
        err = capsys.readouterr().err
        assert refused.value.code == 2 and err.startswith("error: setting base: ") and err.count("\n") == 1, err
        assert not out.exists()
    missing = (f"data.root={tmp_path / 'nope'}",)  # a setting whose runs are all finished trains nothing: not needed
    assert check_settings("tiny", missing, [()], trains=lambda setting: False) == (0.0, False)
    with pytest.raises(DataError, match=r"^setting base: data.root points at .*nope"):
        check_settings("tiny", missing, [()], score_tests=True, trains=lambda setting: False)  # test needs them


def test_a_comparison_times_every_run_to_the_target_it_names():
    from annotated_transformer.lab.seed_statistics import RunResult, summary_markdown, timed_to

    own = RunResult("a", 1, True, curve=((1.0, 30.0), (2.0, 37.0), (3.0, 41.0)), target_seconds=120.0)  # timed to 36.5
    never = RunResult("b", 1, True, curve=((1.0, 20.0), (2.0, 39.9)), target_seconds=None)
    a, b = timed_to([own, never], 40.0)
    assert (a.target_seconds, b.target_seconds) == (180.0, None)
    table = summary_markdown([a, b], "t", 40.0)
    assert "| 3.0 min (1/1) |" in table and "| not reached (0/1) |" in table
    untimed = summary_markdown([own, never], "t", None)  # no target named: each run's own, as it was trained
    assert "| 2.0 min (1/1) |" in untimed and "| not reached (0/1) |" in untimed


def test_finished_runs_are_skipped_and_earlier_runs_in_the_folder_stay_in_the_report(tmp_path):
    from annotated_transformer.lab.sweep import sweep

    _fake_run(tmp_path, "train.lr_factor=1", 1, [30.0])
    _fake_run(tmp_path, "model.dropout=0.3", 1, [25.0])  # from an earlier grid
    lines = []
    code = sweep("tiny", [("train.lr_factor=1",)], [1], tmp_path, Path("no-such-train.py"), log=lines.append)
    assert code == 0 and "1 already finished, 0 to train" in lines[0]
    table = (tmp_path / "sweep.md").read_text()
    assert table.index("`train.lr_factor=1`") < table.index("`model.dropout=0.3`")
    assert lines[-1].endswith("report in " + str(tmp_path / "sweep.md")) and (tmp_path / "sweep.png").is_file()


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_a_run_whose_training_fails_counts_as_failed_without_the_figures_its_folder_holds(tmp_path):
    from annotated_transformer.lab.sweep import sweep

    _fake_run(tmp_path, "train.lr_factor=1", 1, [30.0])  # finished
    _fake_run(tmp_path, "train.lr_factor=2", 1, [11.0, 99.0])  # trained before, with other settings, say
    metrics = tmp_path / "train.lr_factor=2" / "seed1" / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if '"final"' not in line))
    refuse = (sys.executable, "-c", "import sys; print('error: the run was trained with other settings'); sys.exit(2)")
    lines = []
    code = sweep("tiny", [("train.lr_factor=1",), ("train.lr_factor=2",)], [1], tmp_path, refuse, log=lines.append)
    assert code == 1 and any(line.startswith("FAILED with exit code 2: train.lr_factor=2 seed 1") for line in lines)
    assert lines[-1].startswith("sweep: 1/2 runs finished")
    table = (tmp_path / "sweep.md").read_text()
    (failed,) = [row for row in table.splitlines() if row.startswith("| `train.lr_factor=2`")]
    assert "| 0/1, 1 failed |" in failed and "99.00" not in failed and "11.00" not in failed, failed
    assert "| 1/1 |" in table and "30.00" in table  # the finished run as before
    rows = {r["setting"]: r for r in csv.DictReader((tmp_path / "sweep.csv").open())}
    assert rows["train.lr_factor=2"]["failed"] == "True" and rows["train.lr_factor=2"]["epochs"] == ""
    assert rows["train.lr_factor=1"]["failed"] == "False"


def test_a_sweep_without_bleu_curves_says_why_it_draws_no_chart(tmp_path):
    from annotated_transformer.lab.sweep import sweep

    run = tmp_path / "base" / "seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "final", "step": 10, "exact_copies": 97}) + "\n")
    lines = []
    assert sweep("copy", [()], [1], tmp_path, Path("no-such-train.py"), log=lines.append) == 0
    assert "exact copies (of 100)" in (tmp_path / "sweep.md").read_text() and not (tmp_path / "sweep.png").exists()
    assert lines[-1].endswith("(no chart: no run scored val BLEU by epoch; the copy task has none, and "
                              "train.bleu_every=0 turns it off)")


def test_a_run_that_has_not_finished_an_epoch_adds_no_figures(tmp_path):
    run = tmp_path / "a" / "seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "start", "step": 0, "params": 5}) + "\n")
    result = read_result(run, "a", 1)
    assert result.steps is None and result.epochs is None and result.params == 5
    assert mean_sd([result.steps, 100])[0] == 100


def test_a_run_still_trained_by_an_earlier_sweep_is_not_started_twice(tmp_path):
    from annotated_transformer.runtime.errors import RunDirError

    run = grid_runs([()], [1], tmp_path)[0]
    run.path.parent.mkdir(parents=True)
    # A live process whose command line names this run's folder, as an orphaned training's would. It says
    # "ready" once it runs (after exec, so /proc shows its command line) and lives until its stdin closes.
    orphan = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()",
                               f"train.out_dir={run.path}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout.readline() == "ready\n"
        run.pid_file.write_text(str(orphan.pid))
        assert run.running_elsewhere() == orphan.pid
        with pytest.raises(RunDirError, match=f"still being trained by process {orphan.pid}"):
            Launcher(("python", "train.py"), "tiny").start(run)
    finally:
        orphan.stdin.close()
        assert orphan.wait(timeout=60) == 0
    assert run.running_elsewhere() is None  # a stale pid file (the process is gone) is ignored
    run.pid_file.write_text(str(os.getpid()))
    assert run.running_elsewhere() is None  # and so is a live process that is not this run's training


def test_a_damaged_test_scores_file_is_one_line_error(tmp_path):
    from annotated_transformer.runtime.errors import DataError

    _fake_run(tmp_path, "a", 1, [30.0])
    (tmp_path / "a" / "seed1" / "test_scores.json").write_text("{not json")
    with pytest.raises(DataError, match="delete it and score test again"):
        read_result(tmp_path / "a" / "seed1", "a", 1)


def test_the_table_reports_training_compute_to_the_target_and_in_all():
    from annotated_transformer.lab.seed_statistics import timed_to

    def run(seed, flops_curve, total):
        curve = tuple((i + 1.0, bleu) for i, (_, bleu) in enumerate(flops_curve))
        return RunResult("a", seed, True, val_bleu=flops_curve[-1][1], curve=curve, flops_curve=flops_curve,
                         train_flops=total)

    older = RunResult("a", 4, True, val_bleu=39.0, curve=((1.0, 39.0),))  # from before the count: no compute
    results = timed_to([run(1, ((1e14, 30.0), (2e14, 37.0)), 2e14), run(2, ((3e14, 36.0), (5e14, 38.0)), 5e14),
                        run(3, ((1e14, 20.0),), 1e14), older], 36.5)
    assert [r.target_flops for r in results] == [2e14, 5e14, None, None]
    row = next(line for line in summary_markdown(results, "t", 36.5).splitlines() if line.startswith("| `a`"))
    assert "| 350 [200-500] (2/3) |" in row  # TFLOP to the target: median over the counted runs that reached it
    assert "| 267 +/- 208 (n=3) |" in row  # training TFLOP of every run
    assert "| - |" in summary_markdown([RunResult("b", 1, True, val_bleu=30.0)], "t", 36.5)
    small = summary_markdown([RunResult("c", 1, True, val_bleu=1.0, train_flops=4e10)], "t", 0.0)
    assert "| 0.04 (n=1) |" in small  # a short run's compute, not rounded to 0


def test_read_result_takes_the_compute_from_the_epoch_records(tmp_path):
    lines = [{"kind": "epoch", "epoch": 1, "step": 10, "bleu": 30.0, "train_seconds": 60.0, "train_flops": 1e15},
             {"kind": "epoch", "epoch": 2, "step": 20, "bleu": 37.0, "train_seconds": 120.0, "train_flops": 2e15,
              "target_flops": 2e15, "target_seconds": 120.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = read_result(tmp_path, "a", 1)
    assert (result.train_flops, result.target_flops) == (2e15, 2e15)
    assert result.flops_curve == ((1e15, 30.0), (2e15, 37.0))


def test_a_runs_state_is_read_once_a_sweep(tmp_path, monkeypatch):
    """The check of the settings' data and the choice of runs to train both ask whether a run is done: its last.pt
    (the weights and the optimizer's state) is read once, not twice, on every restart of a sweep."""
    reads = []
    monkeypatch.setattr(Launcher, "_is_done", lambda self, run: reads.append(run.path) or True)
    launcher = Launcher(("train.py",), "copy")
    run = grid_runs([()], [1], tmp_path)[0]
    assert launcher.is_done(run) and launcher.is_done(run) and reads == [run.path]
