"""`evaluate --checkpoint PATH --split test [--beam 5] [data.root=DIR]`: translate a Multi30k split and score it
with sacreBLEU."""

from __future__ import annotations

from pathlib import Path

from .options import (CommandParser, add_checkpoint, add_data_root, add_decoding, add_device, add_limit, add_out,
                      add_quantize, data_root)


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Translate a Multi30k split and score it with sacreBLEU and chrF.",
                           takes_overrides=frozenset({"data.root"}))
    add_checkpoint(parser)
    parser.add_argument("--split", default="test", choices=["val", "test"], help="which split (test = test2016 flickr)")
    add_decoding(parser)
    add_out(parser, "where to write the hypotheses (default: beside the checkpoint)")
    add_limit(parser, "score only the first N sentences (for quick checks)")
    add_device(parser)
    add_quantize(parser)
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print N example translations")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_data_root(parser)
    parser.add_argument("overrides", nargs="*", metavar="data.root=DIR",
                        help="the folder with the Multi30k files (default: as the checkpoint was trained)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Score a model (a run, a .pt file or an exported folder) on val or test; BLEU with its signature."""
    args = build_parser(prog).parse_args(argv)
    root = data_root(args, "evaluate")
    from ..config import check_decode_options
    from ..deploy.translator import load_translator, set_token_reduction
    from ..scoring import score_translator

    check_decode_options(args.beam, args.alpha)
    translator = load_translator(args.checkpoint, args.engine, args.device, args.quantize)
    set_token_reduction(translator, args.merge_ratio, args.prune_ratio)
    # An exported folder's hypotheses go inside it (model.<split>.beam<k>.txt), a checkpoint's beside it.
    folder = getattr(translator, "folder", None)
    source = str(Path(folder) / "model.bin") if folder is not None else str(translator.checkpoint)
    score_translator(translator, source, args.split, beam=args.beam, alpha=args.alpha, output=args.out,
                     show=args.show, as_json=args.json, data_root=root, limit=args.limit)
    return 0
