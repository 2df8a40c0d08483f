"""`prepare-data --config NAME [--json]`: download (or find), verify, tokenise and cache the data once (Multi30k,
or your own files).

Run it before a multi-GPU job so that no rank spends its start-up tokenising. A long corpus logs its
progress (sentences tokenised so far) every 10 seconds. With --json, stdout is one JSON object and
the progress lines go to stderr. The batches it counts are those training will take on the device the config
names (under data.static_shapes=auto: the static-shape plan where training takes a CUDA GPU).
"""

from __future__ import annotations

import json
import sys

from ..config import config_parser, load_config
from .options import CommandParser


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = config_parser("Download (or find), verify, tokenise and cache the data; print statistics.", prog,
                           CommandParser, takes_overrides=True)
    parser.add_argument("--json", action="store_true", help="print the statistics as one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Prepare the data a config names and print its statistics."""
    args = build_parser(prog).parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    import torch

    from ..data import load_translation_data
    from ..harness.tasks import static_shapes_for

    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else print
    # training's device: a CUDA GPU named, or found here under auto (a GPU node preparing its own job)
    device = cfg.train.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    data = load_translation_data(cfg, log=log, static=static_shapes_for(cfg, cuda))
    if args.json:
        print(json.dumps(data.stats, sort_keys=True))
    return 0
