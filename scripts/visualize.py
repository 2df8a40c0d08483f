"""Translate one sentence and chart what the model attended to, plus the teaching and training charts.

    uv run python scripts/visualize.py --checkpoint runs/base/best.pt --sentence "Ein Mann fährt Fahrrad." --out viz/
    uv run python scripts/visualize.py --checkpoint runs/base/best.pt --sentence "..." --layers 1 6 --formats html

Open viz/index.html: every chart as a PNG, with links to the interactive HTML versions (they
carry their JavaScript inside and open without internet).
"""

import argparse
import sys

from annotated_transformer.errors import run_cli
from annotated_transformer.visualization import FORMATS, visualize_checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description="Chart the attention of a trained checkpoint on one sentence.")
    parser.add_argument("--checkpoint", required=True, help="a .pt file written by training or averaging")
    parser.add_argument("--sentence", required=True, help="the source-language sentence to translate")
    parser.add_argument("--layers", type=int, nargs="+", metavar="N",
                        help="layer numbers to chart, from 1 as in the chart titles (default: every layer)")
    parser.add_argument("--beam", type=int, default=1, help="beam width of the translation (default: 1, greedy)")
    parser.add_argument("--out", default="viz", help="output folder (default: viz)")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS),
                        help="file formats to write (default: html png)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: the best available)")
    args = parser.parse_args()
    result = visualize_checkpoint(args.checkpoint, args.sentence, args.out, layer_numbers=args.layers,
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


if __name__ == "__main__":
    run_cli(main)
