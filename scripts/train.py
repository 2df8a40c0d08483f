"""Train a Transformer: `uv run python scripts/train.py --config cpu_15min.yaml [section.key=value ...]`.

The same command runs one process (CPU, one GPU) or one rank of many under
`uv run torchrun --nproc_per_node=N scripts/train.py --config base.yaml`. The code is
annotated_transformer/cli/train.py (also `python -m annotated_transformer train`): on the CPU its first step
restarts the process under tcmalloc (`relaunch_with_malloc`, docs/training.md), then `main` trains.
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("train")
