"""`export --checkpoint PATH --out DIR [--quantize none|int8|bf16]`: a CTranslate2 model folder of a trained model.

An existing --out is replaced only with --overwrite (old spelling: --force), and only when it is an earlier
export; export never writes into the run whose weights it reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..runtime.errors import ExportError
from .options import CommandParser, add_checkpoint, add_out, add_overwrite, add_quantize

# --quantize, as every command spells it, onto CTranslate2's weight types.
CT2_WEIGHTS = {"none": "float32", "int8": "int8", "bf16": "bfloat16"}
# What export's --quantize took before it spoke the other commands' vocabulary: the same files come out
# (CTranslate2 writes int8 and int8_float32 alike from float32 weights).
OLD_VALUES = {"float32": "none", "int8_float32": "int8"}


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = CommandParser(prog=prog, description="Export a trained model as a CTranslate2 model folder.")
    add_checkpoint(parser, help="a run directory (the weights its final scores used) or a model file")
    parser.add_argument("--to", default="ctranslate2", choices=["ctranslate2"], help="the engine to export to")
    add_out(parser, "the model folder to write, outside the run it reads (new or empty; an existing export is "
                    "replaced only with --overwrite)", required=True, old=())
    add_quantize(parser, "the weights in the folder: none (float32, exact), int8 or bf16", aliases=OLD_VALUES)
    add_overwrite(parser, "replace the folder of an earlier export at --out (a folder holding anything else is "
                          "refused)")
    parser.add_old_spelling("--force", "--overwrite")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Export a run's (or a model file's) weights with their vocabulary and decoding settings."""
    args = build_parser(prog).parse_args(argv)
    from ..deploy.ct2_export import check_export_out, evaluations_in, export_ctranslate2
    from ..deploy.translator import Translator, torch_checkpoint

    path = torch_checkpoint(args.checkpoint, "export")
    # Before the weights load: a refused --out should cost nothing.
    refuse_own_run(args.out, run_folder(args.checkpoint, path))
    check_export_out(args.out, args.overwrite)
    translator = Translator.from_checkpoint(path, device="cpu")
    weights = CT2_WEIGHTS[args.quantize]
    stale = evaluations_in(args.out) if args.overwrite else []  # the replaced model's translations go with it
    kept_aside: list[str] = []  # the earlier export could not be deleted: its hypotheses are still in it

    def warn(line: str) -> None:
        kept_aside.append(line)
        print(f"warning: {line}", file=sys.stderr)

    out = export_ctranslate2(translator.model, translator.text, translator.config, args.out,
                             quantization=weights, overwrite=args.overwrite, log=warn)
    if stale and not kept_aside:
        print(f"--overwrite: removed the earlier export's hypotheses with it ({', '.join(stale)})")
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"exported {path} -> {out} (CTranslate2, {weights} weights, "
          f"{translator.model.num_parameters() / 1e6:.2f}M parameters, model.bin {size:.1f} MiB)")
    return 0


def run_folder(given: str | Path, weights: Path) -> Path | None:
    """The training run export reads: the --checkpoint folder, or the run folder a model file lies in (a folder
    with training's metrics.jsonl or last.pt); None for a model file outside any run."""
    from ..harness.run_dir import RunDir

    given = Path(given).expanduser()
    if given.is_dir():
        return given
    run = RunDir(weights.parent)
    return run.path if run.metrics.is_file() or run.last.is_file() else None


def refuse_own_run(out: str | Path, run: Path | None) -> None:
    """One line when --out is the run folder, inside it or holds it: export never writes into the run it reads,
    not even with --overwrite (it would replace or mix with the run's own files)."""
    if run is None:
        return
    out_path, run_path = Path(out).expanduser().resolve(), run.resolve()
    if out_path == run_path:
        where = "is the run folder"
    elif run_path in out_path.parents:
        where = "is inside the run folder"
    elif out_path in run_path.parents:
        where = "holds the run folder"
    else:
        return
    raise ExportError(f"--out {out} {where} {run} whose weights export reads; export never writes into a run, not "
                      "even with --overwrite: choose an --out outside it")
