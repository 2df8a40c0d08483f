"""The whole configuration: `Config`, the core sections (sections.py) and then one section per extension, found in
`annotated_transformer/extensions/`; the keys and the documentation (`uv run python -m annotated_transformer.config
> docs/config.md`, config/__main__.py).

A run is described by one `Config`: the sections `model`, `data`, `train` and `decode` (`CoreConfig`), then the
section of each extension, off by default, in the extensions' order. An extension is one module of extensions/
that registers its section, its rules and how it is installed as a module-level `EXTENSION` (sections.Extension);
`discover_extensions` finds them and `config_class` adds their sections, so nothing here names one. Every field
carries a one-line help text (`param(...)`), so listings and the docs come from the same place as the code.
Reading YAML files and dotted overrides is `loading.py`, beside this file:

    cfg = load_config("copy.yaml", ["train.epochs=2", "model.d_model=64"])

Invalid combinations raise `ConfigError` with a one-line message; scripts turn that into
`error: ...` on stderr and exit 2.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from ..sections import CoreConfig, Extension

EXTENSIONS_PACKAGE = f"{__package__.rpartition('.')[0]}.extensions"
NOT_EXTENSIONS = ("builder",)  # the modules of extensions/ that are not an extension: the builder needs Config


def discover_extensions(package: str = EXTENSIONS_PACKAGE) -> list[Extension]:
    """The EXTENSION of every module of `package` but NOT_EXTENSIONS, by module name."""
    found = []
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if module.name in NOT_EXTENSIONS:
            continue
        extension = importlib.import_module(f"{package}.{module.name}").EXTENSION
        if extension.name != module.name:
            raise ValueError(f"{package}.{module.name} registers the section '{extension.name}': name the module "
                             "after its section")
        found.append(extension)
    return found


def config_class(extensions: Sequence[Extension]) -> type[CoreConfig]:
    """The `Config` dataclass of these extensions: CoreConfig's sections, then a section per extension in their order
    (which is also the order of their installation, kind by kind)."""
    extensions = sorted(extensions, key=lambda extension: extension.order)
    sections = [(ext.name, ext.section, dataclasses.field(default_factory=ext.section,
                                                          metadata={"help": f"extension: {ext.help}"}))
                for ext in extensions]
    return dataclasses.make_dataclass(
        "Config", sections, bases=(CoreConfig,),
        namespace={"__module__": __name__, "EXTENSIONS": tuple(extensions),
                   "__doc__": "A whole run: the core sections, then one per extension (EXTENSIONS)."})


Config = config_class(discover_extensions())
EXTENSIONS = Config.EXTENSIONS  # in their order
# The sections of the extensions that change the model itself (the others change how it is trained).
MODEL_EXTENSIONS = tuple(ext.name for ext in EXTENSIONS if ext.kind == "model")


# --------------------------------------------------------------------------- keys and the docs


def field_types(cls: type) -> dict[str, Any]:
    """A config class's field annotations, resolved to types."""
    return typing.get_type_hints(cls)


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every valid dotted key of a config class (e.g. 'model.d_model')."""
    keys = []
    for f in dataclasses.fields(cls):
        ftype = field_types(cls)[f.name]
        if dataclasses.is_dataclass(ftype):
            keys.extend(all_keys(ftype, f"{prefix}{f.name}."))
        else:
            keys.append(prefix + f.name)
    return keys


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field: the source of the config docs."""
    rows = []
    for f in dataclasses.fields(cls):
        ftype = field_types(cls)[f.name]
        if dataclasses.is_dataclass(ftype):
            rows.extend(describe(ftype, f"{prefix}{f.name}."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, default, f.metadata.get("help", "")))
    return rows


def config_markdown(cls: type = Config) -> str:
    """docs/config.md: every config key with its default and meaning, grouped by section."""
    lines = ["# Config keys", "",
             "Every key, its default and what it does; set any of them in a YAML file or as a dotted",
             "override after `--config` (`train.epochs=2`). Generated from the sections' dataclasses (the core",
             "ones in `annotated_transformer/sections.py`, each extension's in its own module in",
             "`annotated_transformer/extensions/`) by `uv run python -m annotated_transformer.config > docs/config.md`",
             "(a test keeps it in step).", ""]
    section = None
    for key, default, text in describe(cls):
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            lines += [f"## {section}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        # "<s>" would be read as HTML in a rendered table
        lines.append(f"| `{key}` | `{shown}` | {text.replace('|', '/').replace('<', '&lt;')} |")
        if head == "top level":
            lines.append("")
    return "\n".join(lines).replace("|\n## ", "|\n\n## ") + "\n"

