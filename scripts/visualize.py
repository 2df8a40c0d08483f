"""Chart what a trained model attends to on one sentence, plus the teaching and training charts.

    uv run python scripts/visualize.py --checkpoint runs/cpu_15min --out viz "Ein Mann fährt Fahrrad."

The code is annotated_transformer/cli/visualize.py (also `python -m annotated_transformer visualize`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("visualize")
