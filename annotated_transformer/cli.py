"""Shared command-line plumbing of the scripts: `--config NAME` plus dotted overrides."""

from __future__ import annotations

import argparse

from .config import Config, load_config


def config_parser(description: str) -> argparse.ArgumentParser:
    """A parser with `--config NAME_OR_PATH` and trailing `section.key=value` overrides."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Overrides look like train.epochs=2 model.d_model=256 (see README for every key).",
    )
    parser.add_argument("--config", required=True, metavar="NAME",
                        help="a config in configs/ by bare name (copy, tiny, small, base) or a path to a YAML file")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="dotted config overrides")
    return parser


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> Config:
    """Parse the command line and load the validated config it names."""
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)
