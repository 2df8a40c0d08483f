"""Score a trained model on a Multi30k split with sacreBLEU (signature included).

    uv run python scripts/evaluate.py --checkpoint runs/cpu_15min --split test --beam 5

The code is annotated_transformer/cli/evaluate.py (also `python -m annotated_transformer evaluate`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("evaluate")
