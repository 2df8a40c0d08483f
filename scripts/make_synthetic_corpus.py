"""A synthetic parallel corpus of WMT length (each line two random Multi30k pairs joined), for benchmarks at scale.

    uv run python scripts/make_synthetic_corpus.py --out /tmp/wmt_like --pairs 4500000

The code is annotated_transformer/cli/make_synthetic_corpus.py (also `python -m annotated_transformer
make-synthetic-corpus`).
"""

from _entry import run_command

if __name__ == "__main__":
    run_command("make-synthetic-corpus")
