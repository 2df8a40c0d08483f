"""Print docs/config.md: `uv run python -m annotated_transformer.config_docs > docs/config.md`."""

from annotated_transformer.config import reference_markdown

if __name__ == "__main__":
    print(reference_markdown(), end="")
