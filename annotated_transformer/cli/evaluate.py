"""`evaluate --checkpoint PATH --split test [--beam 5] [data.root=DIR]`: translate a Multi30k split and score it
with sacreBLEU; `evaluate --checkpoint PATH --input SRC --ref REF` scores any pair of files the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..runtime.errors import UserError
from .options import (CommandParser, add_batch_size, add_checkpoint, add_data_root, add_decoding, add_device,
                      add_limit, add_out, add_overwrite, add_quantize, check_out_file, data_root, path_given)


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Translate a split of the model's data (Multi30k or your own "
                           "files), or any source file with its reference file, and score it with sacreBLEU and chrF.",
                           takes_overrides=frozenset({"data.root"}))
    add_checkpoint(parser)
    parser.add_argument("--split", default=None, choices=["val", "test"],
                        help="which split of the model's data (default: test: Multi30k's test2016 flickr set, or the "
                        "data.test files of a model trained on your own)")
    parser.add_argument("--input", default=None, metavar="SRC", type=path_given,
                        help="score this file instead of a split: UTF-8, one source sentence a line (with --ref)")
    parser.add_argument("--ref", default=None, metavar="REF", type=path_given,
                        help="the reference translations of --input, one a line, as many lines as --input")
    add_decoding(parser)
    add_batch_size(parser)
    add_out(parser, "where to write the hypotheses (default: beside the checkpoint, NAME.SPLIT.beamK.txt; with "
                    "--input, eval/INPUT.beamK.txt in the checkpoint's folder; before .beamK: .firstN with --limit "
                    "N, .mergeR or .pruneR with --merge-ratio R or --prune-ratio R, .int8 or .bf16 with --quantize, "
                    ".alphaA with a beam and an --alpha other than the checkpoint's); an existing file is refused "
                    "unless --overwrite")
    add_overwrite(parser, "replace the hypotheses file of an earlier evaluate (never the --input or --ref file)")
    add_limit(parser, "score only the first N sentences (for quick checks)")
    add_device(parser)
    add_quantize(parser)
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print N example translations")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_data_root(parser)
    parser.add_argument("overrides", nargs="*", metavar="data.root=DIR",
                        help="the folder with the Multi30k files (default: the checkpoint's data.root, else "
                        "$MULTI30K_DIR, else the download cache; a model of your own files reads the files its "
                        "config names)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Score a model (a run, a model file or an exported folder) on val, test or a pair of files; BLEU with its
    signature."""
    args = build_parser(prog).parse_args(argv)
    root = data_root(args, "evaluate")
    files = given_files(args, root)
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be at least 1, got {args.limit}; leave it out to score every sentence")
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.show < 0:
        raise UserError(f"--show must be 0 or more, got {args.show}")
    if args.out is not None:  # before the model loads; the default file is checked once its name is known
        check_out_file(args.out, args.overwrite, {"--input": args.input, "--ref": args.ref,
                                                  "--checkpoint": args.checkpoint})
    from ..config import check_decode_options
    from ..deploy.translator import load_translator, set_token_reduction
    from ..scoring import score_translator

    check_decode_options(args.beam, args.alpha)
    translator = load_translator(args.checkpoint, args.engine, args.device, args.quantize)
    set_token_reduction(translator, args.merge_ratio, args.prune_ratio)
    # An exported folder's hypotheses go inside it (model.<split>.beam<k>.txt), a checkpoint's beside it.
    folder = getattr(translator, "folder", None)
    source = str(Path(folder) / "model.bin") if folder is not None else str(translator.checkpoint)
    # Named in the file whenever given (0 too: it turns off a merging the model was trained with); the ratio in
    # use first when both are given.
    given = [(kind, r) for kind, r in (("merge", args.merge_ratio), ("prune", args.prune_ratio)) if r is not None]
    reduction = next((g for g in given if g[1]), given[0] if given else None)
    score_translator(translator, source, args.split or "test", beam=args.beam, alpha=args.alpha, output=args.out,
                     show=args.show, as_json=args.json, data_root=root, limit=args.limit, files=files,
                     overwrite=args.overwrite, batch_size=args.batch_size, reduction=reduction,
                     quantize=args.quantize, follow_link=args.out is not None)
    return 0


def given_files(args: argparse.Namespace, root: str | None) -> tuple[str, str] | None:
    """(--input, --ref) when both are given, None for a split; any other mix is one line."""
    if args.input is None and args.ref is None:
        return None
    if args.input is None or args.ref is None:
        given, missing = ("--input", "--ref") if args.ref is None else ("--ref", "--input")
        raise UserError(f"{given} needs {missing}: evaluate scores a source file (--input) against its reference "
                        "translations (--ref)")
    if args.split is not None or root is not None:
        other = "--split" if args.split is not None else "data.root"
        raise UserError(f"{other} chooses a split of the model's data; --input and --ref score your own files "
                        "instead: give one or the other")
    return args.input, args.ref
