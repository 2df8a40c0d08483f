"""Train every combination of a grid of overrides x seeds, one run directory each; report mean +/- sd.

    uv run python scripts/sweep.py --config cpu_15min.yaml --grid grid.yaml --seeds 3 --out runs/sweep
"""

import argparse
from pathlib import Path

from annotated_transformer.errors import ConfigError, run_cli
from annotated_transformer.sweep import read_grid, sweep
from annotated_transformer.sweep_report import compare_sweeps


def main() -> int:
    parser = argparse.ArgumentParser(description="Sweep a grid of dotted overrides x seeds; write sweep.md/.csv "
                                     "and a chart of val BLEU against training minutes.")
    parser.add_argument("--config", metavar="NAME", help="the config every run starts from")
    parser.add_argument("--compare", nargs="+", metavar="SWEEP_DIR", default=None,
                        help="train nothing: one report (into --out) of the runs already in these sweep folders")
    parser.add_argument("--target-bleu", type=float, default=None, help="with --compare: the target line to draw")
    parser.add_argument("--grid", default=None, help="YAML: dotted keys to lists of values (default: the config alone)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per setting: 1..N (default 3)")
    parser.add_argument("--seed-list", default=None, help="explicit seeds, comma-separated (instead of --seeds)")
    parser.add_argument("--out", default=None, help="sweep folder (default: runs/sweep_<config>)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once; the CPU threads are split (default 1)")
    parser.add_argument("--score-test", action="store_true",
                        help="score test for every finished run (do it once, for the settings chosen on val)")
    parser.add_argument("--data-root", default=None, help="folder with the Multi30k files (default: as configured)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides for every run")
    args = parser.parse_args()
    if args.compare:
        for path in compare_sweeps([Path(f) for f in args.compare], Path(args.out or "runs/sweep_compare"),
                                   args.target_bleu):
            print(path)
        return 0
    if not args.config:
        raise ConfigError("give --config NAME (the config to sweep), or --compare SWEEP_DIR ... to report only")
    if args.seeds < 1 or args.parallel < 1:
        raise ConfigError("--seeds and --parallel must be at least 1")
    try:
        seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(1, args.seeds + 1))
    except ValueError:
        raise ConfigError(f"--seed-list must be integers separated by commas, got {args.seed_list!r}") from None
    settings = read_grid(args.grid) if args.grid else [()]
    out = Path(args.out or f"runs/sweep_{Path(args.config).stem}")
    return sweep(args.config, settings, seeds, out, Path(__file__).with_name("train.py"), tuple(args.overrides),
                 args.parallel, args.score_test, args.data_root)


if __name__ == "__main__":
    run_cli(main)
