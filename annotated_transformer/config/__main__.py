"""uv run python -m annotated_transformer.config > docs/config.md: every config key, its default and help."""

from .schema import config_markdown

print(config_markdown(), end="")
