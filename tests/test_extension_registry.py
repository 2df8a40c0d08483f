"""An extension is one module: its registration alone puts its section in the config keys, the docs' key table,
validation, the builder and the extension benchmark's arms; a module dropped into extensions/ is found, one left
out leaves no trace."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from annotated_transformer.config import (
    EXTENSIONS,
    Config,
    Extension,
    all_keys,
    apply_override,
    config_class,
    config_markdown,
    discover_extensions,
    load_config,
    param,
)
from annotated_transformer.config.schema import NOT_EXTENSIONS
from annotated_transformer.extensions.builder import build_model
from annotated_transformer.lab.extension_benchmark import ARMS, benchmark_arms
from annotated_transformer.runtime.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ["model.N=1", "model.d_model=16", "model.d_ff=32", "model.h=2"]


@dataclass
class EchoConfig:
    """A made-up extension's section."""

    strength: float = param(0.0, "how loud the made-up echo is (0: off)")


def check_echo(cfg: Config) -> None:
    """The made-up extension's rule."""
    if cfg.echo.strength < 0:
        raise ConfigError(f"echo.strength must not be negative, got {cfg.echo.strength}")


def mark(cfg: Config, model):
    """The made-up model extension's install: the model, marked."""
    model.echo_strength = cfg.echo.strength
    return model


ECHO = Extension(name="echo", section=EchoConfig, help="a made-up echo", order=55, kind="model",
                 on=lambda section: section.strength > 0, install=mark, validate=check_echo,
                 arms={"echo 0.5": ("echo.strength=0.5",)})


def switches_table() -> str:
    """docs/extensions.md's table of the switches."""
    text = (ROOT / "docs" / "extensions.md").read_text(encoding="utf-8")
    return text.split("## The switches", 1)[1].split("\n\n| switch |", 1)[1].split("\n\n", 1)[0]


def test_every_module_of_extensions_registers_its_section_and_config_follows_the_registry():
    modules = {p.stem for p in (ROOT / "annotated_transformer" / "extensions").glob("*.py")}
    assert {ext.name for ext in EXTENSIONS} == modules - {"__init__", *NOT_EXTENSIONS}
    orders = [ext.order for ext in EXTENSIONS]
    assert orders == sorted(set(orders))  # in their order, no two alike
    core = [f.name for f in dataclasses.fields(Config) if f.name not in {ext.name for ext in EXTENSIONS}]
    assert [f.name for f in dataclasses.fields(Config)] == core + [ext.name for ext in EXTENSIONS]
    table = switches_table()
    for ext in EXTENSIONS:
        assert getattr(Config(), ext.name) == ext.section() and not ext.on(ext.section())  # off by default
        assert f"`{ext.name}." in table, f"{ext.name}: give it a row in docs/extensions.md's table"
    assert len(ARMS) == 2 + sum(len(ext.arms) for ext in EXTENSIONS)  # plain, theirs, no attention dropout
    for name, overrides in ARMS.items():
        load_config("tiny", list(overrides))  # every arm is a valid config


def test_a_made_up_extension_reaches_the_keys_the_docs_the_rules_the_builder_and_the_arms():
    cls = config_class((*EXTENSIONS, ECHO))
    assert "echo.strength" in all_keys(cls) and "echo.strength" not in all_keys()
    sections = [f.name for f in dataclasses.fields(cls)]
    assert sections.index("subword_sampling") < sections.index("echo") < sections.index("r_drop")  # by its order
    doc = config_markdown(cls)
    assert "## echo\n" in doc and "| `echo.strength` | `0.0` | how loud the made-up echo is (0: off) |" in doc
    assert "## echo\n" not in config_markdown()
    with pytest.raises(ConfigError, match="echo.strength must not be negative, got -1.0"):
        apply_override(cls(), "echo.strength=-1").validate()
    cfg = cls()
    for override in TINY_MODEL:
        apply_override(cfg, override)
    assert not hasattr(build_model(cfg.validate(), 11, 11), "echo_strength")  # off: not installed
    apply_override(cfg, "echo.strength=0.5")
    assert build_model(cfg.validate(), 11, 11).echo_strength == 0.5
    arms = benchmark_arms(cls.EXTENSIONS)
    assert list(arms)[0] == "plain" and arms["echo 0.5"] == ("echo.strength=0.5",)


def test_a_made_up_objective_is_held_to_one_objective_at_a_time():
    twin = Extension(name="twin", section=EchoConfig, help="a made-up objective", order=65, kind="objective",
                     on=lambda section: section.strength > 0, install=lambda cfg, model, pad, objective: None)
    cfg = config_class((*EXTENSIONS, twin))()
    apply_override(cfg, "twin.strength=1")
    cfg.validate()  # alone: fine
    apply_override(cfg, "r_drop.alpha=5")
    with pytest.raises(ConfigError, match="^r_drop and twin are on together: each replaces the same training loss; "
                                          "use one of them$"):
        cfg.validate()


def test_an_extension_left_out_leaves_no_key_docs_row_rule_or_arm():
    without = config_class([ext for ext in EXTENSIONS if ext.name != "cutoff"])
    assert [k for k in all_keys(without) if k.startswith("cutoff.")] == []
    assert "## cutoff\n" not in config_markdown(without)
    assert "token cutoff 0.1" not in benchmark_arms(without.EXTENSIONS)
    cfg = without().validate()
    apply_override(cfg, "r_drop.alpha=5")
    apply_override(cfg, "guided_attention.weight=0.5")
    with pytest.raises(ConfigError, match="^r_drop and guided_attention are on together"):
        cfg.validate()


def test_a_module_dropped_into_an_extensions_package_is_found_by_its_registration(tmp_path, monkeypatch):
    package = tmp_path / "made_up_extensions"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "builder.py").write_text("raise ImportError('not an extension: never imported')\n", encoding="utf-8")
    module = ("from dataclasses import dataclass\n"
              "from annotated_transformer.sections import Extension, param\n\n\n"
              "@dataclass\nclass EchoConfig:\n    strength: float = param(0.0, 'how loud')\n\n\n"
              "EXTENSION = Extension(name='echo', section=EchoConfig, help='an echo', order=1, kind='model',\n"
              "                      on=lambda section: section.strength > 0, install=lambda cfg, model: model)\n")
    (package / "echo.py").write_text(module, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert [ext.name for ext in discover_extensions("made_up_extensions")] == ["echo"]
        (package / "loud.py").write_text(module, encoding="utf-8")  # registers 'echo' again, under another name
        importlib.invalidate_caches()
        with pytest.raises(ValueError, match="made_up_extensions.loud registers the section 'echo': name the module"):
            discover_extensions("made_up_extensions")
    finally:
        for name in [name for name in sys.modules if name.startswith("made_up_extensions")]:
            del sys.modules[name]
