"""Our fast path against the notebook-style pipeline, in one run on one machine; prints ratios.

    uv run python scripts/benchmark.py --config base.yaml --steps 10
    uv run python scripts/benchmark.py --config small.yaml --checkpoint runs/small/best.pt --json
    uv run python scripts/benchmark.py --config base.yaml --skip-decode --sweep --out runs/benchmark
    uv run python scripts/benchmark.py --config cpu_45min.yaml --engines --checkpoint runs/cpu_45min/best.pt
    uv run python scripts/benchmark.py --config cpu_15min.yaml --extensions --rounds 5

What each side does is described in annotated_transformer/benchmark.py. With --json, stdout is one
JSON object and progress goes to stderr.
"""

import json
import sys
from pathlib import Path

from annotated_transformer.benchmark import format_summary, run_benchmark
from annotated_transformer.config_loading import config_parser, load_config
from annotated_transformer.errors import ConfigError, run_cli


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = config_parser("Benchmark training and decoding: fast path vs the notebook's pipeline.")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per side (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps first")
    parser.add_argument("--checkpoint", default=None, help="trained weights for the decoding figures "
                        "(without it decoding runs on untrained weights of the config's model)")
    parser.add_argument("--one-sentence", type=int, default=100, metavar="N",
                        help="test sentences (evenly spread) given to the slow one-sentence decoder")
    parser.add_argument("--sentences", type=int, default=None, metavar="N",
                        help="decode only the first N test sentences (default: all 1,000)")
    parser.add_argument("--skip-train", action="store_true", help="decoding only")
    parser.add_argument("--skip-decode", action="store_true", help="training only")
    parser.add_argument("--sweep", action="store_true", help="also time the fast path over batch sizes and lengths")
    parser.add_argument("--sweep-tokens", type=int_list, default=[1024, 4096, 16384], metavar="A,B,...")
    parser.add_argument("--sweep-lengths", type=int_list, default=[8, 16, 32, 64, 128], metavar="A,B,...")
    parser.add_argument("--out", default=None, help="folder for benchmark.json (and the sweep chart)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--engines", action="store_true", help="instead: our decoder against CTranslate2 (float32, "
                        "int8) on --checkpoint's weights, each engine in its own process (needs ctranslate2)")
    parser.add_argument("--extensions", action="store_true", help="instead: the cost of each extension switch "
                        "(training tokens/s, decoding sentences/s) against the plain model, interleaved rounds")
    parser.add_argument("--rounds", type=int, default=5, help="--extensions: rounds of --steps steps per arm")
    parser.add_argument("--arms", default=None, help="--extensions: a comma-separated subset of the arms "
                        "(e.g. 'token pruning r=0.25'); plain is always measured")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else (lambda line: print(line, flush=True))
    if args.engines:
        return compare_engines_cli(args, cfg, log)
    if args.extensions:
        return extensions_cli(args, cfg, log)
    result = run_benchmark(cfg, steps=args.steps, warmup=args.warmup, checkpoint=args.checkpoint,
                           one_sentence_limit=args.one_sentence, decode_limit=args.sentences, train=not args.skip_train,
                           decode=not args.skip_decode, sweep_tokens=args.sweep_tokens if args.sweep else None,
                           sweep_lengths=args.sweep_lengths if args.sweep else None, out_dir=args.out, log=log)
    print(json.dumps(result) if args.json else format_summary(result))
    return 0


def compare_engines_cli(args, cfg, log) -> int:
    """--engines: the engine table on test2016, engines.json in --out."""
    from annotated_transformer.engine_benchmark import compare_engines, format_engines

    if not args.checkpoint:
        raise ConfigError("--engines compares decoders on trained weights: pass --checkpoint runs/NAME/best.pt")
    log(f"engines on test2016, checkpoint {args.checkpoint} ...")
    result = compare_engines(args.checkpoint, limit=args.sentences, data_root=cfg.data.root or None, log=log)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "engines.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result) if args.json else format_engines(result))
    return 0


def extensions_cli(args, cfg, log) -> int:
    """--extensions: the cost table of the extension switches, extensions.json in --out."""
    from annotated_transformer.extension_benchmark import format_extensions, measure_extensions, select_arms

    arms = select_arms(args.arms.split(",") if args.arms else None)
    result = measure_extensions(cfg, arms, steps=args.steps, rounds=args.rounds, sentences=args.sentences or 256, log=log)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "extensions.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result) if args.json else format_extensions(result))
    return 0


if __name__ == "__main__":
    run_cli(main)
