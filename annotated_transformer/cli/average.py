"""`average CHECKPOINT ... --out FILE`: the mean of several checkpoints' weights (one architecture, one vocabulary)."""

from __future__ import annotations

import argparse

from .options import add_out, check_required


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(prog=prog, description="Average model parameters of checkpoints of one "
                                     "architecture (e.g. the last epochs of a run).")
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files (e.g. runs/base/epoch_*.pt)")
    add_out(parser, "where to write the averaged checkpoint (.pt)", required=True)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Average the parameters of the given checkpoints into --out."""
    parser = build_parser(prog)
    args = check_required(parser, parser.parse_args(argv))
    from ..harness.checkpointing import average_checkpoints_into

    return average_checkpoints_into(args.checkpoints, args.out)
