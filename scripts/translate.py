"""Translate sentences with a trained checkpoint, one per line, in input order.

    echo "Ein Mann fährt Fahrrad." | uv run python scripts/translate.py --checkpoint runs/base/best.pt
    uv run python scripts/translate.py --checkpoint runs/base/best.pt --input de.txt --beam 5 > en.txt
    uv run python scripts/translate.py --engine ctranslate2 --model exported/base --input de.txt > en.txt
"""

import argparse
import sys

from annotated_transformer.config_loading import check_decode_options
from annotated_transformer.errors import run_cli
from annotated_transformer.files import read_lines
from annotated_transformer.translator import add_engine_arguments, load_translator, set_token_reduction


def main() -> int:
    parser = argparse.ArgumentParser(description="Translate text (one sentence per line) with a checkpoint.")
    add_engine_arguments(parser)
    parser.add_argument("--input", default="-", help="UTF-8 text file, one sentence per line (default: stdin)")
    parser.add_argument("--beam", type=int, default=None, help="beam width (default: the checkpoint's decode.beam_size)")
    parser.add_argument("--alpha", type=float, default=None, help="length-penalty exponent for beam search")
    parser.add_argument("--batch-size", type=int, default=None, help="sentences decoded together")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: the best available)")
    args = parser.parse_args()
    check_decode_options(args.beam, args.alpha)
    lines = read_lines(args.input)
    translator = load_translator(args.engine, args.checkpoint, args.model, args.device, args.quantize)
    set_token_reduction(translator, args.merge_ratio, args.prune_ratio)
    for number, line in enumerate(lines, 1):
        if line.strip() and translator.source_ids(line)[1]:
            print(f"warning: line {number} is longer than the model's limit of {translator.text.max_sentence_len} "
                  "tokens and was truncated", file=sys.stderr)
    outputs = translator.translate(lines, beam_size=args.beam, alpha=args.alpha, batch_size=args.batch_size)
    sys.stdout.write("".join(o + "\n" for o in outputs))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    run_cli(main)
