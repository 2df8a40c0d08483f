"""Typed configuration: dataclasses loaded from YAML, dotted CLI overrides, one validate(); the scripts'
shared `--config` parser; docs/config.md (`uv run python -m annotated_transformer.config > docs/config.md`).

A run is described by one `Config` made of four sections (`model`, `data`,
`train`, `decode`). Every field carries a one-line help text (`param(...)`),
so `--help`-style listings and the docs come from the same place as the code.

    cfg = load_config("copy.yaml", ["train.epochs=2", "model.d_model=64"])

Unknown keys (with the closest valid name suggested), wrong types, missing
files, YAML syntax errors and invalid combinations raise `ConfigError` with a
one-line message; scripts turn that into `error: ...` on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

# The shipped configs live in `configs/` at the top of a checkout; the wheel carries the same files
# as package data in `annotated_transformer/configs/` (setup.py maps the one onto the other).
CHECKOUT_CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def shipped_config_dir() -> Path | None:
    """The folder of the configs that come with the code: the installed package's, else the checkout's."""
    packaged = resources.files("annotated_transformer") / "configs"
    # An unpacked install gives a real folder; a checkout (editable install) has none inside the package.
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return CHECKOUT_CONFIG_DIR if CHECKOUT_CONFIG_DIR.is_dir() else None


def param(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with a help text and optional allowed values."""
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    """The Transformer's shape (the paper's symbols: N, d_model, d_ff, h)."""

    N: int = param(6, "number of encoder layers and of decoder layers (the paper's N)")
    N_dec: int = param(0, "decoder layers when they should differ from N (0: N); a deep encoder with a shallow "
                       "decoder trains and decodes faster")
    d_model: int = param(512, "width of embeddings and of every sublayer's output (d_model)")
    d_ff: int = param(2048, "inner width of the position-wise feed-forward network (d_ff)")
    h: int = param(8, "number of attention heads (h); d_model must be divisible by h")
    dropout: float = param(0.1, "dropout on sublayer outputs, embeddings+positions and attention weights")
    norm_first: bool = param(
        True, "true: pre-norm x + Sublayer(LayerNorm(x)) as the notebook; false: post-norm as the paper"
    )
    tie_embeddings: bool = param(
        False, "share one matrix between source/target embeddings and the generator (needs a shared vocabulary)"
    )
    attention: str = param(
        "sdpa", "attention kernel: 'sdpa' (fused scaled_dot_product_attention) or 'naive' (explicit softmax)",
        choices=("sdpa", "naive"),
    )
    max_positions: int = param(5000, "length of the sinusoidal positional-encoding table")
    layer_norm_eps: float = param(1e-6, "epsilon inside LayerNorm's square root")


@dataclass
class DataConfig:
    """Which data, how it is tokenised, and how it is batched."""

    dataset: str = param("multi30k", "'multi30k' (de->en translation) or 'copy' (synthetic copy task)",
                         choices=("multi30k", "copy"))
    root: str | None = param(None, "folder holding the six Multi30k .gz files (else $MULTI30K_DIR, else download)")
    cache_dir: str = param("~/.cache/annotated_transformer", "where downloads and tokenised caches are kept")
    src_lang: str = param("de", "source language code", choices=("de", "en"))
    tgt_lang: str = param("en", "target language code", choices=("de", "en"))
    tokenizer: str = param("word", "'word' (spaCy rule-based tokenizer) or 'spm' (joint SentencePiece subwords)",
                           choices=("word", "spm"))
    lowercase: bool = param(False, "lowercase all text before tokenising")
    min_freq: int = param(2, "word mode: a token needs this many training occurrences to enter the vocabulary")
    spm_vocab_size: int = param(8000, "spm mode: size of the joint SentencePiece vocabulary")
    max_len: int = param(128, "longest sentence in tokens, <s> and </s> included; longer ones are cut or skipped")
    long_policy: str = param("truncate", "what to do with longer sentences: 'truncate' or 'skip'",
                             choices=("truncate", "skip"))
    batching: str = param("bucket", "'bucket' (length-bucketed, about batch_tokens a batch) or 'reference' "
                          "(the notebook: 32 sentences padded to 72)", choices=("bucket", "reference"))
    batch_tokens: int = param(4096, "bucket mode: about this many padded tokens (source or target) per batch")
    num_workers: int = param(0, "data-loader worker processes (batches are pre-numericalised, so 0 is fine)")
    copy_vocab: int = param(11, "copy task: vocabulary size (token 0 pads, token 1 starts every sequence)")
    copy_seq_len: int = param(10, "copy task: sequence length, start symbol included")
    copy_batch_size: int = param(80, "copy task: sequences per batch")
    copy_batches: int = param(20, "copy task: batches per epoch")


@dataclass
class TrainConfig:
    """The optimisation recipe and the run's bookkeeping."""

    seed: int = param(42, "random seed for weights, dropout, data order")
    epochs: int = param(8, "number of passes over the training data")
    max_steps: int = param(0, "stop after this many optimizer steps (0: no limit)")
    accum_steps: int = param(1, "micro-batches accumulated per optimizer step (the notebook's accum_iter)")
    lr_factor: float = param(1.0, "multiplier of the Noam schedule (the notebook's base_lr / factor)")
    warmup: int = param(4000, "optimizer steps of linear learning-rate warm-up")
    schedule: str = param(
        "noam", "learning-rate schedule: 'noam' (the paper's rate: warm-up, then 1/sqrt(step)), or 'linear' / "
        "'cosine' (warm-up to the same peak, then decay to final_lr_ratio x peak at the run's last step: "
        "train.max_steps, or train.epochs' steps)", choices=("noam", "linear", "cosine"))
    final_lr_ratio: float = param(0.0, "linear/cosine schedules: the rate at the last step, as a fraction of the peak")
    label_smoothing: float = param(0.1, "label smoothing epsilon (the paper's 0.1)")
    adam_betas: list[float] = param([0.9, 0.98], "Adam's (beta1, beta2)")
    adam_eps: float = param(1e-9, "Adam's epsilon")
    clip_grad_norm: float = param(0.0, "clip the gradient's global norm to this (0: no clipping)")
    device: str = param("auto", "'auto' (cuda, else mps, else cpu) or an explicit torch device like 'cuda:1'")
    precision: str = param("auto", "'auto' (bf16 autocast where the GPU or CPU runs bf16 natively, fp32 elsewhere), 'bf16' or 'fp32'",
                           choices=("auto", "bf16", "fp32"))
    compile: bool = param(False, "wrap the model in torch.compile")
    out_dir: str | None = param(None, "run directory (default: runs/<config name>)")
    overwrite: bool = param(False, "replace an existing run directory instead of refusing")
    resume: bool | str = param(
        "auto", "'auto': continue out_dir's run from its last.pt when there is one (a finished run is left as "
        "it is), else start; true: continue it, and fail without last.pt; false: refuse an existing run",
        choices=("auto", True, False))
    keep_last_epochs: int = param(0, "keep only the newest N epoch_NN.pt files (0: keep them all)")
    average_last: int = param(0, "at the end, average the last N epochs' weights into avg.pt and use it "
                              "for the final scores if it beats best.pt on val (0 or 1: off)")
    log_every: int = param(50, "optimizer steps between log lines")
    bleu_every: int = param(1, "epochs between validation BLEU evaluations (0: never)")
    target_bleu: float = param(0.0, "validation BLEU to time: the first epoch and train_seconds reaching it are "
                               "recorded in metrics.jsonl and the final line (0: off)")
    stop_at_target: bool = param(False, "end training at the first epoch whose validation BLEU reaches "
                                 "train.target_bleu (to time a config to a target; with the 'noam' schedule, "
                                 "which needs no run length)")
    best_metric: str = param("bleu", "what picks best.pt: 'bleu' (higher is better) or 'loss' (lower)",
                             choices=("bleu", "loss"))
    progress: bool = param(True, "show a tqdm progress bar on rank 0 (when stderr is a terminal)")
    tensorboard: bool = param(False, "also write the metrics as TensorBoard event files in <run dir>/tensorboard "
                              "(rank 0; needs the tensorboard extra: uv sync --extra tensorboard)")
    final_eval: bool = param(True, "at the end, score val and test with best.pt and show example translations")
    score_test: bool = param(True, "final_eval also scores the test split (false while choosing settings on val)")

    def finished(self, epoch: int, step: int, target_reached: bool = False) -> bool:
        """Whether a run that completed `epoch` epochs and `step` optimizer steps (and reached target_bleu or
        not) is done with this recipe."""
        return bool((self.epochs and epoch >= self.epochs) or (self.max_steps and step >= self.max_steps)
                    or (self.stop_at_target and target_reached))


@dataclass
class DecodeConfig:
    """How translations are produced."""

    beam_size: int = param(1, "beam width (1: greedy)")
    alpha: float = param(0.6, "length-penalty exponent of Wu et al. (2016) for beam search")
    max_len_a: int = param(50, "longest output: source length + this many tokens")
    batch_size: int = param(128, "sentences decoded together")


@dataclass
class Config:
    """A whole run."""

    name: str = param("run", "the run's name (defaults to the config file's stem)")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "model shape"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data and batching"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "optimisation and the run"})
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={"help": "decoding"})

    def validate(self) -> Config:
        """Check rules that involve several fields; raise ConfigError on the first broken one."""
        m, d, t, dec = self.model, self.data, self.train, self.decode
        positive = {
            "model.N": m.N, "model.d_model": m.d_model, "model.d_ff": m.d_ff, "model.h": m.h,
            "model.max_positions": m.max_positions, "data.batch_tokens": d.batch_tokens,
            "data.min_freq": d.min_freq, "data.copy_batch_size": d.copy_batch_size,
            "data.copy_batches": d.copy_batches, "train.accum_steps": t.accum_steps,
            "train.log_every": t.log_every, "train.warmup": t.warmup,
            "decode.beam_size": dec.beam_size, "decode.batch_size": dec.batch_size,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be at least 1, got {value}")
        nonneg = {"train.epochs": t.epochs, "train.max_steps": t.max_steps, "train.bleu_every": t.bleu_every,
                  "data.num_workers": d.num_workers, "train.clip_grad_norm": t.clip_grad_norm,
                  "decode.max_len_a": dec.max_len_a, "train.adam_eps": t.adam_eps,
                  "train.keep_last_epochs": t.keep_last_epochs, "train.average_last": t.average_last}
        for key, value in nonneg.items():
            if value < 0:
                raise ConfigError(f"{key} must not be negative, got {value}")
        if m.d_model % m.h:
            raise ConfigError(
                f"model.d_model ({m.d_model}) must be divisible by model.h ({m.h}); "
                f"pick h from {[k for k in range(1, 17) if m.d_model % k == 0]}"
            )
        if not 0.0 <= m.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {m.dropout}")
        if not 0.0 <= t.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got {t.label_smoothing}")
        if len(t.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in t.adam_betas):
            raise ConfigError(f"train.adam_betas must be two numbers in [0, 1), got {t.adam_betas}")
        if not 0.0 <= t.final_lr_ratio <= 1.0:
            raise ConfigError(f"train.final_lr_ratio must be in [0, 1], got {t.final_lr_ratio}")
        if t.stop_at_target and not t.target_bleu:
            raise ConfigError("train.stop_at_target=true needs train.target_bleu (the validation BLEU to stop at)")
        if m.N_dec < 0:
            raise ConfigError(f"model.N_dec must be 0 (the same as model.N) or positive, got {m.N_dec}")
        if t.target_bleu < 0:
            raise ConfigError(f"train.target_bleu must not be negative, got {t.target_bleu}")
        if t.target_bleu and (d.dataset != "multi30k" or t.bleu_every == 0):
            raise ConfigError("train.target_bleu needs validation BLEU: translation data (data.dataset=multi30k) "
                              "and train.bleu_every of 1 or more")
        if t.lr_factor <= 0:
            raise ConfigError(f"train.lr_factor must be positive, got {t.lr_factor}")
        if t.epochs == 0 and t.max_steps == 0:
            raise ConfigError("train.epochs and train.max_steps are both 0: set one of them to train")
        if d.src_lang == d.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both '{d.src_lang}'; they must differ")
        if d.max_len < 3:
            raise ConfigError(f"data.max_len must be at least 3 (<s>, a token, </s>), got {d.max_len}")
        if d.max_len > m.max_positions:
            raise ConfigError(f"data.max_len ({d.max_len}) exceeds model.max_positions ({m.max_positions})")
        if d.dataset == "copy":
            if d.copy_vocab < 3:
                raise ConfigError(f"data.copy_vocab must be at least 3, got {d.copy_vocab}")
            if d.copy_seq_len < 2:
                raise ConfigError(f"data.copy_seq_len must be at least 2, got {d.copy_seq_len}")
            if t.best_metric == "bleu":
                raise ConfigError("train.best_metric 'bleu' needs translation data; use 'loss' for the copy task")
        if d.dataset == "multi30k" and t.best_metric == "bleu" and t.bleu_every == 0:
            raise ConfigError("train.best_metric=bleu needs validation BLEU, but train.bleu_every is 0; "
                              "set train.bleu_every to 1 or more, or train.best_metric=loss")
        if m.tie_embeddings and d.dataset == "multi30k" and d.tokenizer != "spm":
            raise ConfigError(
                "model.tie_embeddings needs one vocabulary shared by source and target: set data.tokenizer=spm"
            )
        if t.keep_last_epochs and t.average_last > t.keep_last_epochs:
            raise ConfigError(f"train.average_last ({t.average_last}) needs that many epoch checkpoints, but "
                              f"train.keep_last_epochs is {t.keep_last_epochs}; raise it or set it to 0 (keep all)")
        if t.resume is True and t.overwrite:
            raise ConfigError("train.resume and train.overwrite are both true; pick one")
        return self

    def run_dir(self) -> Path:
        """The run directory: train.out_dir, or runs/<name>."""
        return Path(self.train.out_dir) if self.train.out_dir else Path("runs") / self.name



# --------------------------------------------------------------------------- loading


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every valid dotted key of a config class (e.g. 'model.d_model')."""
    keys = []
    for f in dataclasses.fields(cls):
        ftype = _field_types(cls)[f.name]
        if dataclasses.is_dataclass(ftype):
            keys.extend(all_keys(ftype, f"{prefix}{f.name}."))
        else:
            keys.append(prefix + f.name)
    return keys


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not close:  # a typo in the section name: match on the last part alone
        tails = {k.rsplit(".", 1)[-1]: k for k in valid}
        hit = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=1, cutoff=0.6)
        close = [tails[hit[0]]] if hit else []
    return f" (did you mean '{close[0]}'?)" if close else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


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
            raise ConfigError(f"{key} must be a list like [0.9, 0.98], got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]", from_cli) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads '1e-9' as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if from_cli and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")  # pragma: no cover - programming error


def _set_key(obj: Any, parts: list[str], value: Any, full: str, from_cli: bool) -> None:
    cls = type(obj)
    name = parts[0]
    names = [f.name for f in dataclasses.fields(cls)]
    if name not in names:
        raise ConfigError(f"unknown config key '{full}'{_suggest(full, all_keys())}")
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    ftype = _field_types(cls)[name]
    if dataclasses.is_dataclass(ftype):
        if len(parts) == 1:
            if not isinstance(value, dict):
                raise ConfigError(f"'{full}' is a section; give keys under it (e.g. {full}.{dataclasses.fields(ftype)[0].name}=...)")
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
    available = sorted(p.stem for p in shipped.glob("*.yaml")) if shipped else []
    hint = f"; available in configs/: {', '.join(available)}" if available else ""
    raise ConfigError(f"config file '{name}' not found{hint}")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; syntax errors become one-line ConfigErrors with line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML ({problem}); fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, data:, train:, ...)")
    return data


def load_config(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a config by bare name or path, apply dotted overrides, validate."""
    path = resolve_config_path(name)
    cfg = Config(name=path.stem)
    apply_dict(cfg, read_yaml(path), source=str(path))
    for override in overrides:
        apply_override(cfg, override)
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


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, help) for every field: the source of the config docs."""
    rows = []
    for f in dataclasses.fields(cls):
        ftype = _field_types(cls)[f.name]
        if dataclasses.is_dataclass(ftype):
            rows.extend(describe(ftype, f"{prefix}{f.name}."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, default, f.metadata.get("help", "")))
    return rows


def reference_markdown() -> str:
    """docs/config.md: every config key with its default and meaning, grouped by section."""
    lines = ["# Config reference", "",
             "Every key, its default and what it does; set any of them in a YAML file or as a dotted",
             "override after `--config` (`train.epochs=2`). Generated from `annotated_transformer/config.py`",
             "by `uv run python -m annotated_transformer.config > docs/config.md` (a test keeps it in step).", ""]
    section = None
    for key, default, text in describe():
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            lines += [f"## {section}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        lines.append(f"| `{key}` | `{shown}` | {text.replace('|', '/')} |")
        if head == "top level":
            lines.append("")
    return "\n".join(lines).replace("|\n## ", "|\n\n## ") + "\n"


# --------------------------------------------------------------------------- the scripts' shared arguments


def config_parser(description: str) -> argparse.ArgumentParser:
    """A parser with `--config NAME_OR_PATH` and trailing `section.key=value` overrides."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Overrides look like train.epochs=2 model.d_model=256 (see README for every key).",
    )
    parser.add_argument("--config", required=True, metavar="NAME",
                        help="a config in configs/ by bare name (copy, tiny, small, base) or a path to a YAML file")
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
    if alpha is not None and alpha < 0:
        raise ConfigError(f"--alpha must not be negative, got {alpha}")


if __name__ == "__main__":  # uv run python -m annotated_transformer.config > docs/config.md
    print(reference_markdown(), end="")
