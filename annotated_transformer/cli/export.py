"""`export --checkpoint PATH --out DIR [--quantize int8]`: a CTranslate2 model folder of a trained model."""

from __future__ import annotations

import argparse

from ..deploy.ct2_export import QUANTIZATIONS
from .options import add_checkpoint, add_out, add_quantize, check_required


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(prog=prog, description="Export a trained model as a CTranslate2 model folder.")
    add_checkpoint(parser, help="a run directory (the weights its final scores used) or a .pt file")
    parser.add_argument("--to", default="ctranslate2", choices=["ctranslate2"], help="the engine to export to")
    add_out(parser, "the model folder to write (refused if it exists, unless --force)", required=True, old=())
    add_quantize(parser, QUANTIZATIONS, "float32",
                 "weight type in the folder: float32 (exact), int8 or int8_float32 (int8 weights)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Export a run's (or a .pt file's) weights with their vocabulary and decoding settings."""
    parser = build_parser(prog)
    args = check_required(parser, parser.parse_args(argv))
    from ..deploy.ct2_export import export_ctranslate2
    from ..deploy.translator import Translator, torch_checkpoint

    path = torch_checkpoint(args.checkpoint, "export")
    translator = Translator.from_checkpoint(path, device="cpu")
    out = export_ctranslate2(translator.model, translator.text, translator.config, args.out,
                             quantization=args.quantize, force=args.force)
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"exported {path} -> {out} (CTranslate2, {args.quantize}, "
          f"{translator.model.num_parameters() / 1e6:.2f}M parameters, model.bin {size:.1f} MiB)")
    return 0
