"""Average the parameters of several checkpoints of one run.

    uv run python scripts/average_checkpoints.py runs/base/epoch_*.pt --output runs/base/avg.pt
"""

import argparse

from annotated_transformer.errors import run_cli
from annotated_transformer.harness.checkpointing import average_checkpoints_into


def main() -> int:
    parser = argparse.ArgumentParser(description="Average model parameters of checkpoints of one architecture.")
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files (e.g. runs/base/epoch_*.pt)")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint (.pt)")
    args = parser.parse_args()
    return average_checkpoints_into(args.checkpoints, args.output)


if __name__ == "__main__":
    run_cli(main)
