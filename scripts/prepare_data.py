"""Prepare Multi30k once: `uv run python scripts/prepare_data.py --config base.yaml [--json]`.

Downloads (or finds via MULTI30K_DIR / data.root), verifies, tokenises and caches the data. The code
is annotated_transformer/cli/prepare_data.py (also `python -m annotated_transformer prepare-data`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("prepare-data")
