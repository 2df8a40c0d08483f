"""`visualize --checkpoint PATH --sentence "..." --out DIR`: what a trained model attends to on one sentence.

Open DIR/index.html: every chart as a PNG, with links to the interactive HTML versions (they carry
their JavaScript inside and open without internet).
"""

from __future__ import annotations

import argparse
import sys

from .options import add_checkpoint, add_device, add_out, check_required


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options."""
    from ..visualization import FORMATS

    parser = argparse.ArgumentParser(prog=prog, description="Chart the attention of a trained model on one sentence.")
    add_checkpoint(parser, help="a run directory (the weights its final scores used) or a .pt file")
    parser.add_argument("--sentence", required=True, help="the source-language sentence to translate")
    parser.add_argument("--layers", type=int, nargs="+", metavar="N",
                        help="layer numbers to chart, from 1 as in the chart titles (default: every layer)")
    parser.add_argument("--beam", type=int, default=1, help="beam width of the translation (default: 1, greedy)")
    add_out(parser, "output folder (default: viz)", default="viz", old=())
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS),
                        help="file formats to write (default: html png)")
    add_device(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Translate one sentence and chart its attention, plus the teaching and training charts."""
    parser = build_parser(prog)
    args = check_required(parser, parser.parse_args(argv))
    from ..deploy.translator import torch_checkpoint
    from ..visualization import visualize_checkpoint

    path = torch_checkpoint(args.checkpoint, "visualize (the attention weights)")
    result = visualize_checkpoint(path, args.sentence, args.out, layer_numbers=args.layers,
                                  beam_size=args.beam, formats=args.formats, device=args.device)
    if result.attention.truncated:
        print("warning: the sentence is longer than the model's length limit and was truncated", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"translation: {result.attention.translation}")
    print(f"wrote {len(result.files)} files:")
    for path in result.files:
        print(f"  {path}")
    return 0
