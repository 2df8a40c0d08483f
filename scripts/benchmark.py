"""Our fast path against the notebook-style pipeline, in one run on one machine; prints ratios.

    uv run python scripts/benchmark.py --config cpu_15min.yaml --steps 10
    uv run python scripts/benchmark.py --config cpu_45min.yaml --engines --checkpoint runs/cpu_45min

The code, with more examples, is annotated_transformer/cli/benchmark.py (also `python -m annotated_transformer
benchmark`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("benchmark")
