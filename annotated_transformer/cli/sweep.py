"""`sweep --config NAME --grid grid.yaml --seeds 3 --out DIR`: every setting x seed trained, mean +/- sd reported."""

from __future__ import annotations

import sys
from pathlib import Path

from ..runtime.errors import ConfigError, UserError
from ..runtime.files import same_file
from .options import CommandParser, add_data_root, add_out, add_overwrite, overridden, path_given

# How a sweep starts each training: this package's own train command, in the same Python.
TRAIN_COMMAND = (sys.executable, "-m", "annotated_transformer", "train")


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Sweep a grid of dotted overrides x seeds; write sweep.md/.csv and "
                           "a chart of val BLEU against training minutes.", takes_overrides=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", metavar="NAME", help="the config every run starts from")
    parser.add_list("--compare", group=what, default=None, metavar="SWEEP_DIR,SWEEP_DIR,...",
                    help="train nothing: one report (into --out) of the runs already in these sweep folders")
    parser.add_argument("--target-bleu", type=float, default=None, metavar="BLEU",
                        help="with --compare: the target line to draw")
    parser.add_argument("--grid", default=None, metavar="FILE", type=path_given,
                        help="YAML: dotted keys to lists of values (default: the config alone)")
    parser.add_argument("--seeds", type=int, default=None, metavar="N", help="seeds per setting: 1..N (default 3)")
    parser.add_list("--seed-list", item=int, default=None, metavar="N,N,...",
                    help="explicit seeds (instead of --seeds), e.g. 1,2,3")
    add_out(parser, "sweep folder: new, or an earlier sweep's, which it continues (default: runs/sweep_<config>; "
            "with --compare, runs/sweep_compare)", old=())
    add_overwrite(parser, "with --compare: replace the report of an earlier comparison in --out (a sweep's own "
                  "folder is reported anew as its runs finish)")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="runs at once; the CPU threads are split (default 1)")
    parser.add_argument("--score-test", action="store_true",
                        help="score test for every finished run (do it once, for the settings chosen on val)")
    add_data_root(parser)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="overrides for every run (data.root=DIR: the Multi30k files, for the test scores too)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Train a grid (or only report on finished sweeps with --compare)."""
    args = build_parser(prog).parse_args(argv)
    from ..lab.seed_statistics import compare_sweeps
    from ..lab.sweep import check_compare_out, read_grid, sweep

    training = {"--grid": args.grid is not None, "--seeds": args.seeds is not None,
                "--seed-list": args.seed_list is not None, "--parallel": args.parallel != 1,
                "--score-test": args.score_test, "--data-root": args.data_root is not None,
                f"the override {(args.overrides or [''])[0]}": bool(args.overrides)}
    if args.compare and any(training.values()):
        given = next(name for name, value in training.items() if value)
        raise ConfigError(f"{given} is for a sweep that trains; --compare trains nothing (it reports the runs in its "
                          "folders): leave it out")
    if not args.compare and args.target_bleu is not None:
        raise ConfigError("--target-bleu is for --compare; a sweep that trains is timed to its config's "
                          "train.target_bleu (an override: train.target_bleu=B)")
    if args.compare:
        out = Path(args.out or "runs/sweep_compare")
        if any(same_file(out, folder) for folder in args.compare):
            raise UserError(f"--out {out} is one of the --compare folders, whose own report it would replace; "
                            "choose another --out")
        check_compare_out(out, args.overwrite)
        missing = [folder for folder in args.compare if not Path(folder).is_dir()]
        if missing:
            raise UserError(f"--compare {missing[0]} is not a folder; give the folders that scripts/sweep.py wrote "
                            "(its --out)")
        for path in compare_sweeps([Path(f) for f in args.compare], out, args.target_bleu):
            print(path)
        return 0
    if args.seeds is not None and args.seed_list:
        raise ConfigError("--seeds and --seed-list both name the seeds; give one of them")
    args.seeds = 3 if args.seeds is None else args.seeds
    for option, value in (("--seeds", args.seeds), ("--parallel", args.parallel)):
        if value < 1:
            raise ConfigError(f"{option} must be at least 1, got {value}")
    seeds = args.seed_list or list(range(1, args.seeds + 1))
    if len(set(seeds)) < len(seeds):
        twice = next(seed for seed in seeds if seeds.count(seed) > 1)
        raise ConfigError(f"--seed-list names seed {twice} twice; its runs would share one folder: give each seed once")
    # --data-root DIR is the override data.root=DIR (given first: a dotted override wins, as in train).
    overrides = (*([f"data.root={args.data_root}"] if args.data_root else []), *args.overrides)
    root = overridden(overrides, "data.root")  # the runs' data, for their test scores too
    settings = read_grid(args.grid) if args.grid else [()]
    out = Path(args.out or f"runs/sweep_{Path(args.config).stem}")
    return sweep(args.config, settings, seeds, out, TRAIN_COMMAND, overrides, args.parallel,
                 args.score_test, root)
