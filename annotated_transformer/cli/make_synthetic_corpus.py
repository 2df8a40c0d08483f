"""`make-synthetic-corpus --out DIR [--pairs N]`: a parallel corpus of WMT length made from Multi30k's lines.

    make-synthetic-corpus --out /tmp/wmt_like                   # 4.5 million pairs, WMT14 English-German's size
    make-synthetic-corpus --out /tmp/small --pairs 200000 --seed 2 data.root=~/multi30k

Each line is two random Multi30k pairs joined (annotated_transformer/lab/synthetic_corpus.py); train it as your own
files (data.dataset=files data.train=DIR/train data.val=DIR/val data.test=DIR/test). benchmark --scale makes one
itself where it has none.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from .options import CommandParser, add_data_root, add_out, add_overwrite, data_root


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Write a synthetic parallel corpus of WMT length (German and "
                           "English, each line two random Multi30k pairs joined), for benchmarks at scale.",
                           takes_overrides=frozenset({"data.root"}))
    add_out(parser, "the folder for train.de/.en, val.de/.en, test.de/.en and corpus.json; a corpus file already "
                    "there is refused unless --overwrite", required=True, old=())
    parser.add_argument("--pairs", type=int, default=4_500_000, metavar="N",
                        help="training pairs (default 4,500,000: WMT14 English-German's size)")
    parser.add_argument("--val-pairs", type=int, default=3000, metavar="N", help="val pairs (default 3,000)")
    parser.add_argument("--test-pairs", type=int, default=3000, metavar="N", help="test pairs (default 3,000)")
    parser.add_argument("--seed", type=int, default=1, metavar="N",
                        help="the random seed: the same seed makes the same files (default 1)")
    add_overwrite(parser, "replace the corpus files of an earlier make in --out (no other file there)")
    add_data_root(parser)
    parser.add_argument("overrides", nargs="*", metavar="data.root=DIR",
                        help="the folder with the Multi30k files (default: $MULTI30K_DIR, else downloaded to the "
                             "data cache)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Write the corpus and say where it is."""
    args = build_parser(prog).parse_args(argv)
    from ..data.multi30k import resolve_multi30k_dir
    from ..lab.synthetic_corpus import CorpusSpec, check_folder, multi30k_lines, write_corpus
    from ..sections import DataConfig

    spec = CorpusSpec(args.pairs, args.val_pairs, args.test_pairs, args.seed)
    spec.check()  # both before Multi30k is looked for (or downloaded)
    check_folder(Path(args.out).expanduser(), args.overwrite)
    root = resolve_multi30k_dir(SimpleNamespace(root=data_root(args, "make-synthetic-corpus"),
                                                cache_dir=DataConfig().cache_dir), log=print)
    write_corpus(args.out, spec, multi30k_lines(root), overwrite=args.overwrite, log=print)
    print(f"wrote {args.out}: train it with data.dataset=files data.train={args.out}/train data.val={args.out}/val "
          f"data.test={args.out}/test")
    return 0
