"""Reading a `Config`: YAML files (by bare name from configs/ or by path), dotted overrides with type
checks and typo suggestions, dicts from checkpoints; writing it back as YAML; the scripts' shared
`--config` parser. Every problem is one `ConfigError` line (the schema is in schema.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..runtime.errors import ConfigError
from .schema import Config, all_keys, field_types

# The shipped configs live in `configs/` at the top of a checkout; the wheel carries the same files
# as package data in `annotated_transformer/configs/` (setup.py maps the one onto the other).
CHECKOUT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# The shipped configs from the quickest to the largest: the order --help and the README list them in.
CONFIG_LADDER = ("copy", "tiny", "cpu_15min", "cpu_45min", "cpu_60min", "base", "base_spm")


def shipped_config_dir() -> Path | None:
    """The folder of the configs that come with the code: the installed package's, else the checkout's."""
    packaged = resources.files("annotated_transformer") / "configs"
    # An unpacked install gives a real folder; a checkout (editable install) has none inside the package.
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return CHECKOUT_CONFIG_DIR if CHECKOUT_CONFIG_DIR.is_dir() else None


def closest_key(key: str, valid: Sequence[str]) -> str | None:
    """The valid dotted key a mistyped `key` most likely means, or None.

    In order: the same last part in another section (trian.epochs -> train.epochs); a key whose last
    part starts with the given one (train.lr -> train.lr_factor), then one that contains it or is
    contained in it (train.warmup_steps -> train.warmup), in the given section before the others;
    then the nearest spelling (difflib), of the whole key and then of its last part alone.
    """
    section, _, tail = key.rpartition(".")
    parts = [(k, *k.rpartition(".")[::2]) for k in valid]  # (key, its section, its last part)
    same_tail = [k for k, _, t in parts if t == tail]
    if same_tail:
        return same_tail[0]
    for pool in ([p for p in parts if p[1] == section], parts):
        for hits in ([k for k, _, t in pool if len(tail) >= 2 and t.startswith(tail)],
                     [k for k, _, t in pool if (len(tail) >= 3 and tail in t) or (len(t) >= 3 and t in tail)]):
            if hits:
                return min(hits, key=len)  # the least added or taken away
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    if close:
        return close[0]
    tails = {t: k for k, _, t in reversed(parts)}  # the first key of each last part
    hit = difflib.get_close_matches(tail, list(tails), n=1, cutoff=0.6)
    return tails[hit[0]] if hit else None


def _suggest(key: str, valid: Sequence[str]) -> str:
    close = closest_key(key, valid)
    return f" (did you mean '{close}'?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _spelt(value: Any) -> str:
    """A value as YAML and an override spell it (true, null, 'word'), for a message."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value)


def _coerce(value: Any, tp: Any, key: str, from_cli: bool) -> Any:
    """Check `value` against the annotation `tp`; convert the few safe cases (int->float, '1e-9'->float)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for option in inner[:-1]:  # the first type that takes the value (bool | str: true, false or a word)
            try:
                return _coerce(value, option, key, from_cli)
            except ConfigError:
                pass
        return _coerce(value, inner[-1], key, from_cli)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            example = "[0, 2]" if args and args[0] is int else "[0.9, 0.98]" if args and args[0] is float else "[a, b]"
            raise ConfigError(f"{key} must be a list like {example}, got {_spelt(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]", from_cli) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {_spelt(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {_spelt(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '1e-9' as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {_spelt(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        if from_cli and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")  # pragma: no cover - programming error


# Names changed on 2026-11-25 (one name, one meaning); older configs, command lines and checkpoints
# still use the old ones, which are read under the new.
RENAMED_KEYS = {
    "data.max_len": "data.max_sentence_len",
    "model.attention": "model.attention_kernel",
    # the extensions moved from `model` and `objective` to a section each
    "model.local_window": "local_attention.window",
    "model.merge_ratio": "token_merging.merge_ratio",
    "model.prune_ratio": "token_merging.prune_ratio",
    "model.merge_layers": "token_merging.layers",
    "model.proportional_attention": "token_merging.proportional_attention",
    **{f"objective.ss_{k}": f"scheduled_sampling.{k}" for k in ("rate", "schedule", "start", "steps", "sample")},
    **{f"objective.guide_{k}": f"guided_attention.{k}" for k in ("weight", "sigma", "layers", "heads", "decay_steps")},
}
RENAMED_VALUES = {("data.batching", "reference"): "notebook", ("model.attention_kernel", "sdpa"): "fused",
                  ("model.attention_kernel", "naive"): "explicit"}


def renamed(key: str, value: Any) -> tuple[str, Any]:
    """A dotted key and its value under today's names."""
    key = RENAMED_KEYS.get(key, key)
    if isinstance(value, str):
        value = RENAMED_VALUES.get((key, value), value)
    return key, value


def upgrade_config_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a nested config dict (YAML, a checkpoint's) with renamed keys and values under their new names."""
    out: dict[str, Any] = {}
    for section, keys in data.items():
        if not isinstance(keys, dict):
            out[section] = keys  # not a section: apply_dict says what is wrong with it
            continue
        for key, value in keys.items():
            new_key, value = renamed(f"{section}.{key}", value)
            new_section, _, name = new_key.partition(".")
            given_there = data.get(new_section) if isinstance(data.get(new_section), dict) else {}
            if name in out.get(new_section, {}) or (new_key != f"{section}.{key}" and name in given_there):
                raise ConfigError(f"{section}.{key} and {new_key} are one setting (its old and new name); "
                                  f"keep {new_key}")
            out.setdefault(new_section, {})[name] = value
    return out


def _set_key(obj: Any, parts: list[str], value: Any, full: str, from_cli: bool) -> None:
    cls = type(obj)
    name = parts[0]
    names = [f.name for f in dataclasses.fields(cls)]
    if name not in names:
        if len(parts) == 1 and isinstance(value, dict):  # a YAML section: the sections (or keys) here are meant
            raise ConfigError(f"unknown config section '{full}'{_suggest(name, names)}")
        raise ConfigError(f"unknown config key '{full}'{_suggest(full, all_keys())}")
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    ftype = field_types(cls)[name]
    if dataclasses.is_dataclass(ftype):
        if len(parts) == 1:
            if not isinstance(value, dict):
                example = f"{full}.{dataclasses.fields(ftype)[0].name}=..."
                raise ConfigError(f"'{full}' is a section; give keys under it (e.g. {example})")
            for k, v in value.items():
                _set_key(getattr(obj, name), [str(k)], v, f"{full}.{k}", from_cli)
            return
        _set_key(getattr(obj, name), parts[1:], value, full, from_cli)
        return
    if len(parts) > 1:
        raise ConfigError(f"unknown config key '{full}'{_suggest(full, all_keys())}")
    value = _coerce(value, ftype, full, from_cli)
    choices = f.metadata.get("choices")
    if choices and not any(value == c and type(value) is type(c) for c in choices):
        shown = ", ".join(str(c).lower() if isinstance(c, bool) else repr(c) for c in choices)
        raise ConfigError(f"{full} must be one of {shown}; got {value!r}")
    setattr(obj, name, value)


def apply_dict(cfg: Config, data: dict[str, Any], source: str = "config") -> Config:
    """Merge a nested dict (from YAML or a checkpoint) into `cfg`, checking keys and types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (model:, data:, train:, ...)")
    try:
        data = upgrade_config_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    for key, value in data.items():
        try:
            _set_key(cfg, [str(key)], value, str(key), from_cli=False)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return cfg


def apply_override(cfg: Config, override: str) -> Config:
    """Apply one dotted override such as 'train.epochs=2'."""
    if "=" not in override:
        raise ConfigError(f"override '{override}' is not of the form section.key=value (e.g. train.epochs=2)")
    key, raw = override.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{override}' has no key before '='")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    key, value = renamed(key, value)
    _set_key(cfg, key.split("."), value, key, from_cli=True)
    return cfg


def resolve_config_path(name: str) -> Path:
    """A bare name ('copy' or 'copy.yaml') is looked up in ./configs/ (the user's own configs win),
    then in the shipped configs (`shipped_config_dir`); anything else is a path."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    shipped = shipped_config_dir()
    if len(path.parts) == 1:
        for folder in [Path("configs")] + ([shipped] if shipped else []):
            for cand in (folder / name, folder / f"{name}.yaml"):
                if cand.is_file():
                    return cand
    raise config_not_found(name, path)


def config_not_found(name: str, path: Path) -> ConfigError:
    """The error for a --config that names nothing: the nearest config's name, and every shipped one a line after."""
    beside = len(path.parts) > 1 and path.parent.is_dir()  # a path into a folder: its own YAML files
    folders = [path.parent] if beside else [Path("configs"), shipped_config_dir()]
    known = sorted({f.stem for folder in folders if folder and folder.is_dir() for f in folder.glob("*.yaml")})
    close = difflib.get_close_matches(path.name.removesuffix(".yaml"), known, n=1, cutoff=0.6)
    meant = ""
    if close:
        guess = f"{close[0]}.yaml"
        meant = f" (did you mean {path.with_name(guess) if beside else guess}?)"
    shipped = shipped_configs()
    width = max(map(len, shipped), default=0)
    details = ["the shipped configs:", *(f"  {n:<{width}}  {what}" for n, what in shipped.items())] if shipped else []
    return ConfigError(f"config file '{name}' not found{meant}; give a config's name"
                       f"{' (listed below)' if shipped else ''} or a path to a YAML file", details)


def config_summary(path: Path) -> str:
    """A config's purpose: the first comment line of its file (every shipped config starts with one)."""
    try:
        first = path.read_text(encoding="utf-8").splitlines()[0]
    except (OSError, UnicodeDecodeError, IndexError):
        return ""
    return first.lstrip("#").strip() if first.startswith("#") else ""


def shipped_configs() -> dict[str, str]:
    """Every config that comes with the code, by bare name, with its one-line purpose, smallest first."""
    folder = shipped_config_dir()
    paths = sorted(folder.glob("*.yaml"), key=lambda p: (CONFIG_LADDER.index(p.stem) if p.stem in CONFIG_LADDER
                                                         else len(CONFIG_LADDER), p.stem)) if folder else []
    return {p.stem: config_summary(p) for p in paths}


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one silently: a
    setting typed twice would be read as whichever came second). Keys that a merge (`<<: *base`) brings in may be
    given again: that is what a merge is for."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Checked the first time a mapping is flattened, before its merges are copied into it (in place).
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key '{key_node.value}' is given twice in one mapping; keep one",
                        key_node.start_mark)
                seen.add(key)
        super().flatten_mapping(node)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; syntax errors become one-line ConfigErrors with line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML ({problem}); fix the syntax") from None
    if data is None:  # an empty file (or only comments) would train the defaults, which nobody means
        raise ConfigError(f"{path} is empty: a config names its settings by section (model:, data:, train:, ...); "
                          "start from a shipped config, e.g. configs/copy.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, train:, ...), "
                          f"not a {type(data).__name__}")
    return data


def names_a_library(value: Any) -> bool:
    """Whether a train.malloc value is a library file's path (has a '/' or ends in .so, .so.4, ...), not a name."""
    if not isinstance(value, str):
        return False
    return "/" in value or "\\" in value or re.search(r"\.so(\.[0-9.]*)?$", value) is not None


def refuse_library_from_file(key: str, value: Any, source: str) -> None:
    """A file (a config, a sweep's grid) may name an allocator for train.malloc but never a library to preload:
    that would run whatever code the file points at, so a downloaded config could run code."""
    if key == "train.malloc" and names_a_library(value):
        raise ConfigError(f"{source}: train.malloc={value} is a library's path, which a file may not give (it would "
                          f"run that library's code); pass it on the command line (train.malloc={value}) or preload "
                          f"it yourself (LD_PRELOAD={value}), or set auto, system, tcmalloc or mimalloc in the file")


def load_config(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a config by bare name or path, apply dotted overrides, validate."""
    path = resolve_config_path(name)
    cfg = Config(name=path.stem)
    data = read_yaml(path)
    train = data.get("train")
    if isinstance(train, dict):  # checked before the overrides: a command line's own path is the user's choice
        refuse_library_from_file("train.malloc", train.get("malloc"), str(path))
    apply_dict(cfg, data, source=str(path))
    for override in overrides:
        apply_override(cfg, override)
    check_alpha(cfg.decode.alpha, "decode.alpha")  # a saved run's config is read as it was trained
    return cfg.validate()


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """A plain nested dict (YAML/JSON/checkpoint friendly)."""
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from `config_to_dict` output (e.g. from a checkpoint)."""
    return apply_dict(Config(), data, source="saved config").validate()


def config_yaml(cfg: Config) -> str:
    """The resolved config as YAML text, in field order."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


# --------------------------------------------------------------------------- the scripts' shared arguments


def config_help() -> str:
    """--config's help: a bare name or a path, and every shipped config with its purpose."""
    configs = shipped_configs()
    width = max(map(len, configs), default=0)
    listed = "".join(f"\n  {name:<{width}}  {what}" for name, what in configs.items())
    return f"a config by bare name (from ./configs/, then the shipped ones) or a path to a YAML file:{listed}"


def config_parser(description: str, prog: str | None = None, parser_class: type[argparse.ArgumentParser]
                  = argparse.ArgumentParser, **kwargs: Any) -> argparse.ArgumentParser:
    """A parser with `--config NAME_OR_PATH` and trailing `section.key=value` overrides; `parser_class` and
    `kwargs` choose the parser (the commands' own, which says more on a mistake)."""
    parser = parser_class(
        **kwargs, prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"--config NAME: {config_help()}\n\nOverrides look like train.epochs=2 model.d_model=256; every "
               "key is in docs/config.md.",
    )
    parser.add_argument("--config", required=True, metavar="NAME",
                        help="a shipped config by bare name (listed below) or a path to a YAML file")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="dotted config overrides")
    return parser


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> Config:
    """Parse the command line and load the validated config it names."""
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)


def check_decode_options(beam: int | None, alpha: float | None) -> None:
    """The translate and evaluate scripts' --beam and --alpha, refused in one line when out of range."""
    if beam is not None and beam < 1:
        raise ConfigError(f"--beam must be at least 1, got {beam}")
    if alpha is not None:
        check_alpha(alpha, "--alpha")


def check_alpha(alpha: float, name: str) -> None:
    """A length-penalty exponent `name` (decode.alpha, --alpha, alpha=): a number of at least 0, NaN and inf refused;
    one ConfigError line otherwise."""
    if not 0 <= alpha < math.inf:
        raise ConfigError(f"{name} must be a number of at least 0, got {alpha}")
