"""Score a checkpoint on a Multi30k split with sacreBLEU (signature included).

    uv run python scripts/evaluate.py --checkpoint runs/base/best.pt --split test --beam 5
    uv run python scripts/evaluate.py --engine ctranslate2 --model exported/base --split test
"""

import argparse
from pathlib import Path

from annotated_transformer.config_loading import check_decode_options
from annotated_transformer.errors import run_cli
from annotated_transformer.evaluation import evaluate_translator
from annotated_transformer.translator import add_engine_arguments, load_translator, set_token_reduction


def main() -> int:
    parser = argparse.ArgumentParser(description="Translate a Multi30k split and score it with sacreBLEU and chrF.")
    add_engine_arguments(parser)
    parser.add_argument("--split", default="test", choices=["val", "test"], help="which split (test = test2016 flickr)")
    parser.add_argument("--beam", type=int, default=None, help="beam width (default: the checkpoint's decode.beam_size)")
    parser.add_argument("--alpha", type=float, default=None, help="length-penalty exponent for beam search")
    parser.add_argument("--output", default=None, help="where to write the hypotheses (default: beside the checkpoint)")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print N example translations")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--data-root", default=None, help="folder with the Multi30k files (default: as configured)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: the best available)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N sentences (for quick checks)")
    args = parser.parse_args()
    check_decode_options(args.beam, args.alpha)
    translator = load_translator(args.engine, args.checkpoint, args.model, args.device, args.quantize)
    set_token_reduction(translator, args.merge_ratio, args.prune_ratio)
    # An exported folder's hypotheses go inside it (model.<split>.beam<k>.txt), a checkpoint's beside it.
    source = args.checkpoint or str(Path(args.model) / "model.bin")
    evaluate_translator(translator, source, args.split, beam=args.beam, alpha=args.alpha, output=args.output,
                        show=args.show, as_json=args.json, data_root=args.data_root, limit=args.limit)
    return 0


if __name__ == "__main__":
    run_cli(main)
