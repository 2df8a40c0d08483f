"""Export a trained model to CTranslate2 (`uv sync --extra ctranslate2` first).

    uv run python scripts/export.py --checkpoint runs/cpu_45min --out exported/cpu_45min --quantize int8
    uv run python scripts/translate.py --checkpoint exported/cpu_45min --input de.txt --out en.txt

The code is annotated_transformer/cli/export.py (also `python -m annotated_transformer export`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("export")
