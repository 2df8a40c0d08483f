"""Train a Transformer: `uv run python scripts/train.py --config copy.yaml [section.key=value ...]`.

The same command runs one process (CPU, one GPU) or one rank of many under
`torchrun --nproc_per_node=N scripts/train.py --config base.yaml`.
"""

from annotated_transformer.config_loading import config_parser, parse_config
from annotated_transformer.errors import run_cli
from annotated_transformer.harness.trainer import train_worker


def main() -> int:
    parser = config_parser("Train the Transformer (copy task or Multi30k de->en).")
    cfg = parse_config(parser)
    results = train_worker(cfg)
    # Stopped by a signal after saving last.pt: exit as the signal would have (128 + its number).
    return 128 + int(results["stopped_by"]) if "stopped_by" in results else 0


if __name__ == "__main__":
    run_cli(main)
