"""Prepare Multi30k once: `uv run python scripts/prepare_data.py --config base.yaml [section.key=value ...] [--json]`.

Downloads (or finds via MULTI30K_DIR / data.root) and verifies the six files, tokenises every
split, builds the vocabulary and the cache, and prints statistics. Run it before a multi-GPU
job so that no rank spends its start-up tokenising. With --json, stdout is one JSON object and
the progress lines go to stderr.
"""

import json
import sys

from annotated_transformer.config_loading import config_parser, load_config
from annotated_transformer.data import load_translation_data
from annotated_transformer.errors import run_cli


def main() -> int:
    parser = config_parser("Download, verify, tokenise and cache Multi30k; print statistics.")
    parser.add_argument("--json", action="store_true", help="print the statistics as one JSON object on stdout")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else print
    data = load_translation_data(cfg, log=log)
    if args.json:
        print(json.dumps(data.stats, sort_keys=True))
    return 0


if __name__ == "__main__":
    run_cli(main)
