"""`export --checkpoint PATH --out DIR [--quantize none|int8|bf16]`: a CTranslate2 model folder of a trained model."""

from __future__ import annotations

from .options import CommandParser, add_checkpoint, add_out, add_quantize

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
    add_out(parser, "the model folder to write (refused if it exists, unless --force)", required=True, old=())
    add_quantize(parser, "the weights in the folder: none (float32, exact), int8 or bf16", aliases=OLD_VALUES)
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Export a run's (or a .pt file's) weights with their vocabulary and decoding settings."""
    args = build_parser(prog).parse_args(argv)
    from ..deploy.ct2_export import export_ctranslate2
    from ..deploy.translator import Translator, torch_checkpoint

    path = torch_checkpoint(args.checkpoint, "export")
    translator = Translator.from_checkpoint(path, device="cpu")
    weights = CT2_WEIGHTS[args.quantize]
    out = export_ctranslate2(translator.model, translator.text, translator.config, args.out,
                             quantization=weights, force=args.force)
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"exported {path} -> {out} (CTranslate2, {weights} weights, "
          f"{translator.model.num_parameters() / 1e6:.2f}M parameters, model.bin {size:.1f} MiB)")
    return 0
