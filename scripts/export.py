"""Export a trained checkpoint to another inference engine (today: CTranslate2).

    uv sync --extra ctranslate2
    uv run python scripts/export.py --checkpoint runs/cpu_45min/best.pt --out exported/cpu_45min --quantization int8
    uv run python scripts/translate.py --engine ctranslate2 --model exported/cpu_45min < de.txt
"""

import argparse

from annotated_transformer.errors import run_cli
from annotated_transformer.ct2_export import QUANTIZATIONS, export_ctranslate2
from annotated_transformer.translator import Translator


def main() -> int:
    parser = argparse.ArgumentParser(description="Export a checkpoint as a CTranslate2 model folder.")
    parser.add_argument("--checkpoint", required=True, help="a .pt file written by training or averaging")
    parser.add_argument("--to", default="ctranslate2", choices=["ctranslate2"], help="the engine to export to")
    parser.add_argument("--out", required=True, help="the model folder to write (refused if it exists, unless --force)")
    parser.add_argument("--quantization", default="float32", choices=QUANTIZATIONS,
                        help="weight type in the folder: float32 (exact), int8 or int8_float32 (int8 weights)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    args = parser.parse_args()
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")
    out = export_ctranslate2(translator.model, translator.text, translator.config, args.out,
                             quantization=args.quantization, force=args.force)
    size = (out / "model.bin").stat().st_size / 2**20
    print(f"exported {args.checkpoint} -> {out} (CTranslate2, {args.quantization}, "
          f"{translator.model.num_parameters() / 1e6:.2f}M parameters, model.bin {size:.1f} MiB)")
    return 0


if __name__ == "__main__":
    run_cli(main)
