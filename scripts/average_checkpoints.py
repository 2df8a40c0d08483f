"""Average the parameters of several checkpoints of one run.

    uv run python scripts/average_checkpoints.py runs/base/epoch_*.safetensors --out runs/base/avg.safetensors

The code is annotated_transformer/cli/average.py (also `python -m annotated_transformer average-checkpoints`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("average-checkpoints")
