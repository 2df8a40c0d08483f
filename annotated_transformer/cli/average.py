"""`average-checkpoints CHECKPOINT ... --out FILE`: the mean of several checkpoints' weights (one architecture, one
vocabulary), written as one model file. Its older name, `average`, still runs it."""

from __future__ import annotations

import sys

from .options import CommandParser, add_out, add_overwrite


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Average model parameters of checkpoints of one architecture "
                           "(e.g. the last epochs of a run).")
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files (e.g. runs/base/epoch_*.safetensors)")
    add_out(parser, "where to write the averaged model file (NAME.safetensors: weights, config and vocabulary in one "
            "file)", required=True)
    add_overwrite(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Average the parameters of the given checkpoints into --out."""
    args = build_parser(prog).parse_args(argv)
    from pathlib import Path

    import warnings

    from ..checkpoints import TwoRunsWarning, average_into, model_file, model_file_forms
    from ..runtime.errors import UserError
    from .options import kept_by_a_run, refuse_a_runs_file

    written = model_file_forms(args.out)[0]  # the .safetensors file NAME, NAME.pt or NAME.safetensors means
    run = kept_by_a_run(written)
    if written.stem != "avg":  # a run's avg file is an average of its checkpoints: this command may write it
        for path in (Path(args.out), written):
            refuse_a_runs_file(path, kept_by_a_run(path))
    elif run is not None and any(f.is_file() and f.resolve().parent != run.resolve()
                                 for f in map(model_file, args.checkpoints)):  # a folder: refused as no checkpoint
        raise UserError(f"--out {args.out} is the average of the run in {run}, which only that run's own "
                        "checkpoints make; average files of that folder, or choose another --out")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", TwoRunsWarning)
        out = average_into(args.checkpoints, args.out, overwrite=args.overwrite)
    for warning in said:
        if issubclass(warning.category, TwoRunsWarning):
            print(f"warning: {warning.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    n = len(args.checkpoints)
    print(f"averaged {n} checkpoint{'' if n == 1 else 's'} into {out} (config and vocabulary inside)")
    return 0
