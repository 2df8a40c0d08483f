"""`average-checkpoints CHECKPOINT ... --out FILE`: the mean of several checkpoints' weights (one architecture, one
vocabulary). Its older name, `average`, still runs it."""

from __future__ import annotations

from .options import CommandParser, add_out


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Average model parameters of checkpoints of one architecture "
                           "(e.g. the last epochs of a run).")
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files (e.g. runs/base/epoch_*.safetensors)")
    add_out(parser, "where to write the averaged model file (NAME.safetensors, with NAME.json)", required=True)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Average the parameters of the given checkpoints into --out."""
    args = build_parser(prog).parse_args(argv)
    from ..harness.checkpointing import average_checkpoints_into

    return average_checkpoints_into(args.checkpoints, args.out)
