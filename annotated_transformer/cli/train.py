"""`train --config NAME [section.key=value ...]`: one process (CPU, one GPU) or one rank under torchrun."""

from __future__ import annotations

import argparse

from ..config import config_parser, load_config


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options."""
    parser = config_parser("Train the Transformer (the copy task or Multi30k de->en).", prog)
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="the run directory (the same as train.out_dir=DIR; default: runs/<config name>)")
    parser.add_argument("--device", default=None, help="the same as train.device=NAME: auto, cpu, cuda, cuda:N or mps")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Train from a config; the exit code of a run stopped by a signal is 128 + its number."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    shorthands = [f"train.out_dir={args.out}"] * (args.out is not None) + \
        [f"train.device={args.device}"] * (args.device is not None)
    cfg = load_config(args.config, [*shorthands, *args.overrides])  # overrides given after them win
    from ..harness.trainer import train_worker  # the harness loads after the config is known to be good

    results = train_worker(cfg)
    return 128 + int(results["stopped_by"]) if "stopped_by" in results else 0
