"""Train every combination of a grid of overrides x seeds, one run directory each; report mean +/- sd.

    uv run python scripts/sweep.py --config cpu_15min.yaml --grid grid.yaml --seeds 3 --out runs/sweep

The code is annotated_transformer/cli/sweep.py (also `python -m annotated_transformer sweep`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("sweep")
