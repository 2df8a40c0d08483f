"""`benchmark --config NAME`: our fast path against the notebook-style pipeline, in one run on one machine.

    benchmark --config base.yaml --steps 10
    benchmark --config cpu_15min.yaml --checkpoint runs/cpu_15min --json
    benchmark --config base.yaml --skip-decode --shape-sweep --out runs/benchmark
    benchmark --config cpu_45min.yaml --engines --checkpoint runs/cpu_45min
    benchmark --config cpu_15min.yaml --extensions --rounds 5
    benchmark --config cpu_15min.yaml --profile --steps 20
    benchmark --config base.yaml --products
    benchmark --config base.yaml --gpu --out runs/gpu_check
    benchmark --config cpu_15min.yaml --all --checkpoint runs/cpu_15min --rounds 3
    benchmark --config wmt14_en_de_base.yaml --scale --pairs 4500000 --out runs/scale

What each side does is described in annotated_transformer/lab/benchmark.py. With --json, stdout is one
JSON object and progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..config import Config, config_parser, load_config
from ..runtime.errors import ConfigError
from .options import CommandParser, add_checkpoint, add_device, add_limit, add_out, add_overwrite, path_given


def build_parser(prog: str | None) -> CommandParser:
    """The benchmark's options: what to time, on which weights, and the tables instead of the default one."""
    parser = config_parser("Benchmark training and decoding: fast path vs the notebook's pipeline.", prog,
                           CommandParser, takes_overrides=True)
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="timed training steps per side (median reported; default 10); --products: timed calls "
                             "of each product; --gpu: timed steps a mode and batch size (default 30); --scale: the "
                             "training's optimizer steps (default 10)")
    # Named for what it is: train.warmup, on the same command line, is the learning rate's warm-up.
    parser.add_argument("--warmup-steps", type=int, default=2, metavar="N",
                        help="untimed training steps before the timed ones (default 2); --products: untimed calls")
    parser.add_old_spelling("--warmup", "--warmup-steps")
    add_checkpoint(parser, required=False, help="trained weights for the decoding figures: a run directory or a "
                   "model file (.safetensors; or an older .pt); without it decoding runs on untrained weights of "
                   "the config's model")
    parser.add_argument("--one-sentence", type=int, default=100, metavar="N",
                        help="test sentences (evenly spread) given to the slow one-sentence decoder")
    add_limit(parser, "decode only the first N test sentences (default: all 1,000)")
    add_device(parser, "the same as train.device=NAME (default: the config's)")
    parser.add_argument("--skip-train", action="store_true", help="decoding only")
    parser.add_argument("--skip-decode", action="store_true", help="training only")
    parser.add_argument("--shape-sweep", action="store_true", help="also time the fast path over batch sizes and "
                        "lengths (not scripts/sweep.py, which trains)")
    parser.add_old_spelling("--sweep", "--shape-sweep")
    parser.add_list("--sweep-tokens", item=int, default=[1024, 4096, 16384], metavar="N,N,...",
                    help="--shape-sweep: the batch sizes in tokens (default 1024,4096,16384)")
    parser.add_list("--sweep-lengths", item=int, default=[8, 16, 32, 64, 128], metavar="N,N,...",
                    help="--shape-sweep: the sentence lengths (default 8,16,32,64,128)")
    add_out(parser, "folder for benchmark.json (and the shape-sweep chart), or for the chosen table's JSON; a file "
                    "of that name already there is refused unless --overwrite", old=())
    add_overwrite(parser, "replace the files of an earlier benchmark in --out")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--engines", action="store_true", help="instead: our decoder against CTranslate2 (float32, "
                        "int8) on --checkpoint's weights, each engine in its own process (needs ctranslate2)")
    parser.add_argument("--extensions", action="store_true", help="instead: the cost of each extension switch "
                        "(training tokens/s, decoding sentences/s) against the plain model, interleaved rounds")
    parser.add_argument("--profile", action="store_true", help="instead: where a training step's time goes "
                        "(matmul, attention, elementwise, loss, optimizer, overhead), torch.profiler over --steps "
                        "steps")
    parser.add_argument("--products", action="store_true", help="instead: each linear layer's matrix products "
                        "(forward, input gradient, weight gradient) alone, data.batch_tokens rows, against the "
                        "measured matmul peak")
    parser.add_argument("--gpu", action="store_true", help="instead: the GPU check, in one call of a few minutes: "
                        "the measured bf16 peak, the training step eager / compiled / captured / graphed at the "
                        "config's batch size and at 16k tokens (tokens/s, ms/step, MFU, GPU busy share), the train "
                        "command for --train-seconds (epochs, validation time, the whole run's estimate, val BLEU), "
                        "then greedy val decoding; gpu_check.json in --out (docs/gpu.md)")
    parser.add_list("--modes", default=None, metavar="MODE,MODE,...", help="--gpu: the step modes to time (eager, "
                    "compiled, captured, graphed; default: all four on a GPU, eager and compiled on a CPU)")
    parser.add_argument("--train-seconds", type=float, default=150.0, metavar="S",
                        help="--gpu: seconds of the timed training run (0: none; default 150)")
    parser.add_argument("--all", action="store_true", help="instead: the whole speed picture for --checkpoint, side "
                        "by side: training eager vs compiled (tokens/s, MFU, compilation) and our decoders against "
                        "CTranslate2 float32/int8 (sent/s, batch-1 latency, BLEU), medians of --rounds interleaved "
                        "rounds")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="rounds: --extensions' of --steps steps per arm (default 5), --all's interleaved rounds "
                             "(default 3), --engines' (default 1)")
    parser.add_list("--arms", default=None, metavar="ARM,ARM,...", help="--extensions: a subset of the arms "
                    "(e.g. 'token pruning r=0.25,token cutoff 0.1'); plain is always measured")
    parser.add_argument("--scale", action="store_true", help="instead: the data path at WMT14's size: on a synthetic "
                        "corpus of WMT length (made where missing), prepare-data with the config's data settings "
                        "and an empty cache (wall time, peak memory), then the start of training on it (seconds to "
                        "the first step, peak memory), each a process of its own, against the goals of a 2-core "
                        "machine; scale.json in --out (docs/own_data.md)")
    parser.add_argument("--pairs", type=int, default=None, metavar="N",
                        help="--scale: the corpus's training pairs (default 4,500,000: WMT14 English-German's size)")
    parser.add_argument("--data-dir", default=None, metavar="DIR", type=path_given,
                        help="--scale: the folder the corpus is kept in, made there where missing (default: "
                             "synthetic-N in data.cache_dir); the temporary cache and run go there too")
    return parser


def read_config(args: argparse.Namespace) -> Config:
    """The config the benchmark measures: --config, --device, then the dotted overrides."""
    return load_config(args.config, [*([f"train.device={args.device}"] if args.device else []), *args.overrides])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Print the benchmark's table (or JSON) for a config."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 30 if args.gpu else 10
    cfg = read_config(args)
    if args.checkpoint:
        from ..deploy.translator import torch_checkpoint

        args.checkpoint = str(torch_checkpoint(args.checkpoint, "benchmark (--engines exports it itself)"))
    stream = sys.stderr if args.json else sys.stdout  # with --json, stdout is the JSON alone

    def log(line: str) -> None:
        print(line, file=stream, flush=True)
    tables = [f"--{name}" for name in ("scale", "gpu", "all", "engines", "extensions", "profile", "products")
              if getattr(args, name)]
    if len(tables) > 1:  # each is a table of its own: the first would run, the others be dropped unsaid
        raise ConfigError(f"{' and '.join(tables)} are different tables; run one of them at a time")
    if args.pairs is not None and not args.scale:  # given at all, even at its default
        raise ConfigError("--pairs sizes the synthetic corpus of --scale; add --scale, or leave --pairs out")
    for option, value in (("--rounds", args.rounds), ("--one-sentence", args.one_sentence), ("--limit", args.limit)):
        if value is not None and value < 1:  # none of them means anything at 0: --limit 0 decoded every sentence
            raise ConfigError(f"{option} must be at least 1, got {value}")
    check_out(args)
    if args.scale:
        return scale(args, cfg, log)
    if args.gpu:
        return check_gpu(args, cfg, log)
    if args.all:
        return speed_report(args, cfg, log)
    if args.engines:
        return compare_engines(args, cfg, log)
    if args.extensions:
        return compare_extensions(args, cfg, log)
    if args.profile:
        return profile_step(args, cfg, log)
    if args.products:
        return time_products(args, cfg, log)
    if args.skip_train and args.skip_decode and not args.shape_sweep:
        raise ConfigError("--skip-train with --skip-decode leaves nothing to measure; drop one of them")
    from ..lab.benchmark import format_summary, run_benchmark

    result = run_benchmark(cfg, steps=args.steps, warmup=args.warmup_steps, checkpoint=args.checkpoint,
                           one_sentence_limit=args.one_sentence, decode_limit=args.limit, train=not args.skip_train,
                           decode=not args.skip_decode, sweep_tokens=args.sweep_tokens if args.shape_sweep else None,
                           sweep_lengths=args.sweep_lengths if args.shape_sweep else None, out_dir=args.out, log=log)
    print(json.dumps(result) if args.json else format_summary(result))
    return 0


def output_files(args: argparse.Namespace) -> list[str]:
    """The files the chosen table writes into --out."""
    for flag, name in (("scale", "scale.json"), ("gpu", "gpu_check.json"), ("all", "speed_report.json"),
                       ("engines", "engines.json"), ("extensions", "extensions.json"), ("profile", "profile.json"),
                       ("products", "products.json")):
        if getattr(args, flag):
            return [name]
    return ["benchmark.json", *(["sweep.html", "sweep.png"] if args.shape_sweep else [])]


def check_out(args: argparse.Namespace) -> None:
    """Before anything is measured: --out is a folder, and what the table writes there is new, or --overwrite."""
    from ..runtime.errors import UserError
    from ..runtime.files import refuse_to_replace

    if args.out is None:
        return
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give the folder to write {output_files(args)[0]} into")
    for name in output_files(args):
        refuse_to_replace(out / name, args.overwrite)


def write_json(out: str | None, name: str, result: dict[str, Any]) -> None:
    """`result` as <out>/<name> when --out is given, written atomically."""
    from ..runtime.files import write_json as write

    if out:
        write(Path(out) / name, result)


def compare_engines(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--engines: the engine table on test2016, engines.json in --out."""
    from ..lab.engine_benchmark import compare_engines as measure, format_engines, median_rows

    if not args.checkpoint:
        raise ConfigError("--engines compares decoders on trained weights: pass --checkpoint runs/NAME")
    rounds = []
    for r in range(args.rounds or 1):  # each round runs every engine once, in the same order
        log(f"engines on test2016, checkpoint {args.checkpoint}, round {r + 1}/{args.rounds or 1} ...")
        result = measure(args.checkpoint, limit=args.limit, data_root=cfg.data.root or None, log=log)
        rounds.append(result["rows"])
    result["rows"], result["rounds"] = median_rows(rounds, result["beam"]), len(rounds)
    write_json(args.out, "engines.json", result)
    print(json.dumps(result) if args.json else format_engines(result))
    return 0


def check_gpu(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--gpu: the GPU check's table, gpu_check.json in --out (written after each part)."""
    from ..lab.gpu_check import format_gpu_check, gpu_check

    result = gpu_check(cfg, args.overrides, steps=args.steps, warmup=args.warmup_steps, modes=args.modes,
                       train_seconds=args.train_seconds, out_dir=args.out, log=log)
    print(json.dumps(result) if args.json else format_gpu_check(result))
    return 0


def speed_report(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--all: training eager vs compiled and the decoding engines, speed_report.json in --out."""
    from ..lab.speed_report import format_speed_report, measure_speed_report

    if not args.checkpoint:
        raise ConfigError("--all compares decoders on trained weights: pass --checkpoint runs/NAME")
    if args.steps < 1 or args.warmup_steps < 1:
        raise ConfigError(f"--all needs --steps and --warmup-steps of at least 1 (got {args.steps}, "
                          f"{args.warmup_steps})")
    result = measure_speed_report(cfg, args.checkpoint, rounds=args.rounds or 3, steps=args.steps,
                                  warmup=args.warmup_steps, limit=args.limit or 500, log=log)
    write_json(args.out, "speed_report.json", result)
    print(json.dumps(result) if args.json else format_speed_report(result))
    return 0


def profile_step(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--profile: the step's time by kind of work, profile.json in --out."""
    from ..lab.step_profile import format_profile, profile_in_fresh_process

    result = profile_in_fresh_process(cfg, steps=args.steps, warmup=args.warmup_steps, log=log)
    write_json(args.out, "profile.json", result)
    print(json.dumps(result) if args.json else format_profile(result))
    return 0


def time_products(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--products: the linear layers' products against the peak, products.json in --out."""
    from ..lab.product_benchmark import format_products, measure_products

    if args.steps < 1 or args.warmup_steps < 0:
        raise ConfigError(f"--steps must be at least 1 and --warmup-steps at least 0 (got {args.steps}, "
                          f"{args.warmup_steps}); --products calls each product that often")
    result = measure_products(cfg, repeats=args.steps, warmup=args.warmup_steps, log=log)
    write_json(args.out, "products.json", result)
    print(json.dumps(result) if args.json else format_products(result))
    return 0


def compare_extensions(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--extensions: the cost table of the extension switches, extensions.json in --out."""
    from ..lab.extension_benchmark import format_extensions, measure_extensions, select_arms

    arms = select_arms(args.arms)
    result = measure_extensions(cfg, arms, steps=args.steps, rounds=args.rounds or 5, sentences=args.limit or 256,
                                log=log)
    write_json(args.out, "extensions.json", result)
    print(json.dumps(result) if args.json else format_extensions(result))
    return 0


def scale(args: argparse.Namespace, cfg: Any, log: Any) -> int:
    """--scale: prepare-data and the start of training on a synthetic corpus of WMT length, scale.json in --out."""
    from ..lab.scale_benchmark import WMT14_PAIRS, format_scale, scale_benchmark

    overrides = [*([f"train.device={args.device}"] if args.device else []), *args.overrides]  # as read_config
    pairs = WMT14_PAIRS if args.pairs is None else args.pairs
    result = scale_benchmark(args.config, overrides, cfg, pairs=pairs, data_dir=args.data_dir, steps=args.steps,
                             log=log)
    write_json(args.out, "scale.json", result)
    print(json.dumps(result) if args.json else format_scale(result))
    return 0
