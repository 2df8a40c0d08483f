"""A sweep's figures: each run's results read back from its metrics.jsonl, the mean and spread over seeds per setting,
and the files a sweep writes (sweep.md, sweep.csv, the chart of val BLEU against training minutes)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.errors import ConfigError, DataError
from ..runtime.files import atomic_write, writing
from ..harness.run_dir import final_record, read_metrics

TEST_SCORES = "test_scores.json"  # written into a run directory by the sweep's --score-test


@dataclass
class RunResult:
    """What one finished (or unfinished) run reached, from its metrics.jsonl (and test_scores.json)."""

    setting: str
    seed: int
    finished: bool
    epochs: int | None = None  # None until the first epoch ends
    steps: int | None = None
    params: int | None = None
    val_bleu: float | None = None  # the final record's: the chosen weights, greedy
    test_bleu: float | None = None  # greedy, from test_scores.json
    test_bleu_beam: float | None = None  # beam search, when the run's config decodes with a beam
    train_seconds: float | None = None
    target_seconds: float | None = None  # train_seconds when val BLEU first reached train.target_bleu
    tokens_per_s: float | None = None  # median of the run's log lines
    curve: tuple[tuple[float, float], ...] = ()  # (training minutes, val BLEU) after each scored epoch
    train_flops: float | None = None  # model FLOPs of the optimizer steps (runs from before the count: None)
    target_flops: float | None = None  # train_flops when val BLEU first reached the target
    flops_curve: tuple[tuple[float, float], ...] = ()  # (training FLOPs, val BLEU) after each scored epoch
    val_loss: float | None = None  # the last epoch's
    exact_copies: int | None = None  # the copy task's final record: sequences of 100 copied exactly
    failed: bool = False  # its training failed in this sweep: what its folder holds (maybe from other settings) is
    # left out, and its log says why

    @property
    def last_bleu(self) -> float | None:
        """Val BLEU of the last scored epoch (what an unfinished run had reached)."""
        return self.curve[-1][1] if self.curve else None


def read_result(path: Path, setting: str, seed: int) -> RunResult:
    """The figures of the run in `path` (missing files give an unfinished result with no figures)."""
    metrics = path / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_kind.setdefault(r.get("kind", ""), []).append(r)
    epochs, final = by_kind.get("epoch", []), final_record(records)  # an earlier end of a run continued: none
    result = RunResult(setting, seed, finished=final is not None)
    if epochs:
        last = epochs[-1]
        result.epochs, result.steps = int(last.get("epoch", 0)), int(last.get("step", 0))
        result.train_seconds, result.val_loss = last.get("train_seconds"), last.get("val_loss")
        result.target_seconds = last.get("target_seconds")
        result.curve = tuple((e["train_seconds"] / 60, e["bleu"]) for e in epochs
                             if isinstance(e.get("bleu"), (int, float)) and "train_seconds" in e)
        result.train_flops, result.target_flops = last.get("train_flops"), last.get("target_flops")
        result.flops_curve = tuple((e["train_flops"], e["bleu"]) for e in epochs
                                   if isinstance(e.get("bleu"), (int, float)) and "train_flops" in e)
    if by_kind.get("start"):
        result.params = by_kind["start"][-1].get("params")
    speeds = [r["tokens_per_s"] for r in by_kind.get("train", []) if isinstance(r.get("tokens_per_s"), (int, float))]
    result.tokens_per_s = statistics.median(speeds) if speeds else None
    if final is not None:
        result.val_bleu, result.steps = final.get("val_bleu"), int(final.get("step", result.steps or 0))
        result.exact_copies = final.get("exact_copies")
    scores = test_scores(path, final)
    if scores is not None:
        result.test_bleu, result.test_bleu_beam = scores.get("greedy"), scores.get("beam")
    return result


def test_scores(path: Path, final: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's test_scores.json when it scores the run's end `final` (its final record): not an earlier end of a
    run continued since (a file that names no step, of an older version, is taken as it is); None otherwise."""
    tests = path / TEST_SCORES
    if final is None or not tests.is_file():
        return None
    try:
        scores = json.loads(tests.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {tests} ({exc}); delete it and score test again with --score-test") from None
    step = scores.get("step")
    return scores if step is None or step == final.get("step") else None


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (None below 2 values) and count of the values that are not None."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)


def _pm(values: Sequence[float | None], digits: int = 2) -> str:
    mean, sd, n = mean_sd(values)
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" +/- {sd:.{digits}f}" if sd is not None else "") + (f" (n={n})")


def _time_to_target(results: Sequence[RunResult]) -> str:
    """'median min [lowest-highest] (k/n)' of the minutes to the target, over the runs that reached it."""
    minutes = sorted(r.target_seconds / 60 for r in results if r.target_seconds is not None)
    if not minutes:
        return f"not reached (0/{len(results)})"
    span = f" [{minutes[0]:.1f}-{minutes[-1]:.1f}]" if len(minutes) > 1 else ""
    return f"{statistics.median(minutes):.1f} min{span} ({len(minutes)}/{len(results)})"


def _compute_to_target(results: Sequence[RunResult]) -> str:
    """'median TFLOP [lowest-highest] (k/n)' of the training compute to the target, over the runs that reached it."""
    counted = [r for r in results if r.train_flops is not None]  # runs from before the count say nothing
    tflop = sorted(r.target_flops / 1e12 for r in counted if r.target_flops is not None)
    if not tflop:
        return f"not reached (0/{len(counted)})" if counted else "-"
    span = f" [{tflop[0]:.0f}-{tflop[-1]:.0f}]" if len(tflop) > 1 else ""
    return f"{statistics.median(tflop):.0f}{span} ({len(tflop)}/{len(counted)})"


def group(results: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    """Results by setting, in first-seen order."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.setting, []).append(r)
    return groups


def is_copy_task(results: Sequence[RunResult]) -> bool:
    """Whether the results are the copy task's: a run ended with its exact copies, and none has a BLEU figure."""
    return (any(r.exact_copies is not None for r in results)
            and not any(r.val_bleu is not None or r.curve or r.test_bleu is not None for r in results))


def summary_markdown(results: Sequence[RunResult], title: str, target_bleu: float | None,
                     copy: bool | None = None) -> str:
    """sweep.md: one row per setting, mean +/- sd over its seeds (sample sd; n = runs with the figure). `copy`: the
    copy task's columns (exact copies, val loss) instead of BLEU's (None: as the results say, `is_copy_task`)."""
    if copy if copy is not None else is_copy_task(results):
        return _copy_summary(results, title)
    target = f"val BLEU {target_bleu:g}" if target_bleu else "target"
    # a target to reach: the one named, or each run's own train.target_bleu (a comparison of sweeps names none)
    timed = bool(target_bleu) or any(r.target_seconds is not None for r in results)
    lines = [f"# {title}", "",
             f"| setting | runs done | val BLEU | test BLEU (greedy) | test BLEU (beam) | time to {target} | "
             f"TFLOP to {target} | epochs | last epoch's val BLEU | steps | training min | training TFLOP | "
             "tokens/s | params |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting, rs in group(results).items():
        lines.append(
            f"| `{setting}` | {_runs_done(rs)} | {_pm([r.val_bleu for r in rs])} | {_pm([r.test_bleu for r in rs])} "
            f"| {_pm([r.test_bleu_beam for r in rs])} | {_time_to_target(rs) if timed else '-'} | "
            f"{_compute_to_target(rs) if timed else '-'} | "
            f"{_pm([r.epochs for r in rs], 0)} | {_pm([r.last_bleu for r in rs])} | {_pm([r.steps for r in rs], 0)} | "
            f"{_cost_columns(rs)} |")
    lines += ["", "Mean +/- sample standard deviation over seeds (n: runs that have the figure). Val BLEU: the "
              "chosen weights' (best, or avg when it scores higher), greedy, of finished runs. Time to target: "
              "median training minutes (optimizer steps only) [fastest-slowest] (runs that reached it / runs). TFLOP: "
              "training compute in 10^12 model FLOPs (matmuls of the real sentence lengths, 3x the forward pass, "
              "extra passes of the objective counted), which compares across machines.", ""]
    return "\n".join(lines)


def _copy_summary(results: Sequence[RunResult], title: str) -> str:
    """sweep.md of the copy task: exact copies and validation loss, where translation has BLEU."""
    lines = [f"# {title}", "",
             "| setting | runs done | exact copies (of 100) | last epoch's val loss | epochs | steps | training min | "
             "training TFLOP | tokens/s | params |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setting, rs in group(results).items():
        lines.append(f"| `{setting}` | {_runs_done(rs)} | {_pm([r.exact_copies for r in rs], 1)} | "
                     f"{_pm([r.val_loss for r in rs], 4)} | {_pm([r.epochs for r in rs], 0)} | "
                     f"{_pm([r.steps for r in rs], 0)} | {_cost_columns(rs)} |")
    lines += ["", "Mean +/- sample standard deviation over seeds (n: runs that have the figure). Exact copies: of 100 "
              "fresh sequences, greedy-decoded by the chosen weights at the end of a finished run. TFLOP: training "
              "compute in 10^12 model FLOPs.", ""]
    return "\n".join(lines)


def _runs_done(rs: Sequence[RunResult]) -> str:
    """The 'runs done' cell: finished runs of the setting's, and how many failed in this sweep ('1/3, 1 failed')."""
    failed = sum(r.failed for r in rs)
    return f"{sum(r.finished for r in rs)}/{len(rs)}" + (f", {failed} failed" if failed else "")


def _cost_columns(rs: Sequence[RunResult]) -> str:
    """The training minutes, TFLOP, tokens/s and parameters cells of one setting's row."""
    params = next((r.params for r in rs if r.params), None)
    tflop = [r.train_flops / 1e12 if r.train_flops is not None else None for r in rs]  # under 10: two decimals
    return (f"{_pm([r.train_seconds / 60 if r.train_seconds else None for r in rs], 1)} | "
            f"{_pm(tflop, 0 if min((t for t in tflop if t is not None), default=10) >= 10 else 2)} | "
            f"{_pm([r.tokens_per_s for r in rs], 0)} | {f'{params / 1e6:.2f}M' if params else '-'}")


CSV_FIELDS = ("setting", "seed", "finished", "epochs", "steps", "params", "val_bleu", "test_bleu", "test_bleu_beam",
              "train_seconds", "target_seconds", "tokens_per_s", "train_flops", "target_flops", "val_loss",
              "exact_copies", "failed")


def results_csv(results: Sequence[RunResult]) -> str:
    """sweep.csv: one row per run."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in results:
        writer.writerow(["" if getattr(r, f) is None else getattr(r, f) for f in CSV_FIELDS])
    return out.getvalue()


def curve_points(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Chart data: each run's (minutes, BLEU) points, and per setting the mean over seeds after each epoch."""
    points = [{"setting": r.setting, "run": f"{r.setting} seed {r.seed}", "minutes": m, "bleu": b, "kind": "run"}
              for r in results for m, b in r.curve]
    for setting, rs in group(results).items():
        for i in range(max((len(r.curve) for r in rs), default=0)):
            at = [r.curve[i] for r in rs if len(r.curve) > i]
            points.append({"setting": setting, "run": f"{setting} mean", "kind": "mean",
                           "minutes": statistics.fmean(m for m, _ in at), "bleu": statistics.fmean(b for _, b in at)})
    return points


def sweep_chart(results: Sequence[RunResult], title: str, target_bleu: float | None = None):
    """Val BLEU against training minutes: a faint line per run, a bold line per setting's mean (altair)."""
    import altair as alt

    from ..visualization.heatmap import inline_data

    data = inline_data(curve_points(results))
    x = alt.X("minutes:Q", title="training minutes (optimizer steps)")
    y = alt.Y("bleu:Q", title="val BLEU (greedy)", scale=alt.Scale(zero=False))
    color = alt.Color("setting:N", title=None, legend=alt.Legend(orient="bottom", columns=1, labelLimit=600))
    runs = alt.Chart(data).transform_filter("datum.kind == 'run'").mark_line(opacity=0.3, strokeWidth=1).encode(
        x=x, y=y, color=color, detail="run:N")
    means = alt.Chart(data).transform_filter("datum.kind == 'mean'").mark_line(point=True, strokeWidth=2.5).encode(
        x=x, y=y, color=color, tooltip=["setting:N", alt.Tooltip("minutes:Q", format=".1f"),
                                        alt.Tooltip("bleu:Q", format=".2f")])
    layers = [runs, means]
    if target_bleu:
        layers.append(alt.Chart(inline_data([{"bleu": target_bleu}])).mark_rule(strokeDash=[4, 4], color="gray")
                      .encode(y="bleu:Q"))
    return alt.layer(*layers, title=title).properties(width=640, height=360)


def collect_results(folders: Sequence[Path]) -> list[RunResult]:
    """Every run found in sweep folders (<folder>/<setting>/seed<N>/), named '<folder>: <setting>' when
    there are several folders; for comparing sweeps of different configs in one table and chart."""
    results = []
    for folder in folders:
        for run in sorted(Path(folder).glob("*/seed*/metrics.jsonl")):
            seed = run.parent.name.removeprefix("seed")
            if seed.isdigit():
                setting = run.parent.parent.name
                results.append(read_result(run.parent, setting if len(folders) == 1 else
                                           f"{Path(folder).name}: {setting}", int(seed)))
    return results


REPORT_FILES = ("sweep.md", "sweep.csv", "sweep.html", "sweep.png")  # what write_report writes
COMPARISON_TITLE = "comparison of sweeps"  # sweep.md's heading: what tells an earlier comparison's folder


def write_report(out: Path, results: Sequence[RunResult], title: str, target_bleu: float | None,
                 chart: bool = True, copy: bool | None = None) -> list[Path]:
    """sweep.md, sweep.csv and (when `chart` and altair can draw) sweep.html / sweep.png in `out`; `copy`: the copy
    task's table (None: as the results say)."""
    written = []
    files = (("sweep.md", summary_markdown(results, title, target_bleu, copy)), ("sweep.csv", results_csv(results)))
    for name, text in files:
        path = out / name
        with writing(path):
            atomic_write(path, lambda f, t=text: f.write(t.encode("utf-8")))
        written.append(path)
    if chart and any(r.curve for r in results):
        from ..visualization import save_chart

        with writing(out / "sweep.html", "write the chart"):
            save_chart(sweep_chart(results, title, target_bleu), out / "sweep")
        written += [out / "sweep.html", out / "sweep.png"]
    return written


def timed_to(results: Sequence[RunResult], target_bleu: float) -> list[RunResult]:
    """The results with `target_seconds` taken from each run's curve for `target_bleu` (None: not reached).

    Runs of different configs may have been timed to different train.target_bleu values (or none);
    a comparison times them all to the one target it names.
    """
    def first(curve: tuple[tuple[float, float], ...], scale: float = 1.0) -> float | None:
        return next((x * scale for x, bleu in curve if bleu >= target_bleu), None)

    return [dataclasses.replace(r, target_seconds=first(r.curve, 60.0), target_flops=first(r.flops_curve))
            for r in results]


def compare_sweeps(folders: Sequence[Path], out: Path, target_bleu: float | None = None) -> list[Path]:
    """One report (into `out`) of the runs already in several sweep folders; the files written."""
    results = collect_results(folders)
    if not results:
        raise ConfigError(f"no runs found in {', '.join(map(str, folders))}; give folders written by scripts/sweep.py")
    if target_bleu:
        results = timed_to(results, target_bleu)
    return write_report(out, results, COMPARISON_TITLE, target_bleu)
