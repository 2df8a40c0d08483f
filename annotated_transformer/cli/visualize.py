"""`visualize --checkpoint PATH --out DIR "SENTENCE"`: what a trained model attends to on one sentence.

The sentence is one quoted argument or its words, joined with spaces (older spelling: --sentence "...").
Open DIR/index.html: every chart as a PNG, with links to the interactive HTML
versions (they share DIR/vega.js, the charts' JavaScript, and open without internet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..runtime.errors import UserError
from .options import (CommandParser, add_beam, add_checkpoint, add_device, add_out, add_overwrite,
                      check_utf8_arguments, kept_by_a_run, refuse_a_runs_file)


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    from ..visualization import FORMATS

    parser = CommandParser(prog=prog, description="Chart the attention of a trained model on one sentence.")
    add_checkpoint(parser, help="a run directory (the weights its final scores used) or a model file")
    parser.add_argument("text", nargs="*", help="the source-language sentence to chart: one quoted argument, or its "
                        "words (joined with spaces)")
    parser.add_argument("--sentence", metavar="TEXT", help=argparse.SUPPRESS)  # older: the sentence as one argument
    parser.add_list("--layers", item=int, metavar="N,N,...",
                    help="layer numbers to chart, from 1 as in the chart titles (default: every layer)")
    add_beam(parser)
    add_out(parser, "output folder (default: viz); a chart already there is refused unless --overwrite", default="viz",
            old=())
    add_overwrite(parser, "replace the charts of an earlier visualize in --out (other files there are left alone)")
    parser.add_list("--formats", choices=FORMATS, default=list(FORMATS), metavar="FORMAT,FORMAT,...",
                    help=f"file formats to write: {', '.join(FORMATS)} (default: {','.join(FORMATS)})")
    add_device(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Translate one sentence and chart its attention, plus the teaching and training charts."""
    args = build_parser(prog).parse_args(argv)
    if args.text and args.sentence is not None:
        raise UserError("give the sentence as arguments or with --sentence, not both")
    if not args.text and args.sentence is None:
        raise UserError(f"give the sentence to chart, e.g. {prog or 'visualize'} --checkpoint PATH "
                        "\"Ein Mann fährt Fahrrad.\"")
    quoted = [a for a in args.text if len(a.split()) > 1]
    if len(args.text) > 1 and quoted:  # words alone are one sentence, joined ("Dr. Müller kommt." too)
        raise UserError(f"visualize charts one sentence, and {args.text[0]!r} came with {len(args.text) - 1} more "
                        "argument(s); quote the sentence as one argument")
    sentence = " ".join(args.text) if args.text else args.sentence
    check_utf8_arguments([sentence], input_option=False)
    from ..deploy.translator import torch_checkpoint
    from ..visualization import visualize_checkpoint

    refuse_a_runs_file(args.out, kept_by_a_run(Path(args.out)))  # e.g. a run's charts/: its training curves
    path = torch_checkpoint(args.checkpoint, "visualize (the attention weights)")
    result = visualize_checkpoint(path, sentence, args.out, layer_numbers=args.layers,
                                  beam_size=args.beam, formats=args.formats, device=args.device,
                                  overwrite=args.overwrite)
    if result.attention.truncated:
        print("warning: the sentence is longer than the model's length limit and was truncated", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"translation: {result.attention.translation}")
    print(f"wrote {len(result.files)} files:")
    for path in result.files:
        print(f"  {path}")
    return 0
