"""Translate with a trained model: a prompt on a terminal, sentences as arguments, a file or a pipe.

    uv run python scripts/translate.py --checkpoint runs/cpu_15min
    uv run python scripts/translate.py --checkpoint runs/cpu_15min "Ein Mann fährt Fahrrad."
    uv run python scripts/translate.py --checkpoint runs/cpu_15min --input de.txt --out en.txt --beam 5

The code is annotated_transformer/cli/translate.py (also `python -m annotated_transformer translate`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("translate")
