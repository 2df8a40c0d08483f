"""Export a trained `EncoderDecoder` to CTranslate2, the OpenNMT project's inference engine.

    uv sync --extra ctranslate2
    uv run python scripts/export.py --checkpoint runs/cpu_45min --out exported/cpu_45min

The model is described through CTranslate2's model-specification API, weight by weight, so the
engine computes what our model computes:

  * pre-norm (`model.norm_first`, with a final LayerNorm per stack) and post-norm (the paper's);
  * our four attention projections fused the way the engine expects: self-attention as one
    [W^Q; W^K; W^V] matrix and W^O, encoder-decoder attention as W^Q, [W^K; W^V] and W^O;
  * embeddings scaled by sqrt(d_model); our sinusoidal table itself (the engine's default table
    orders sines and cosines differently), LayerNorm's epsilon, the generator's bias;
  * tied or separate embeddings, word-level or SentencePiece vocabularies (our ids, in order);
  * the source framed as <s> ... </s>, decoding started from <s>, as our `Batch` does.

Beside the engine's files the folder holds what translating text needs from our side: the run's
config (`config.yaml`) and text pipeline (`vocab/`), so `ct2_translator.CT2Translator` tokenises
and detokenises exactly as `Translator` does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import MODEL_EXTENSIONS, Config
from ..data.text import TEXT_FILES
from ..runtime.errors import ExportError
from ..model import EncoderDecoder, MultiHeadedAttention

QUANTIZATIONS = ("float32", "int8", "int8_float32", "bfloat16")  # CTranslate2's weight types
CONFIG_FILE = "config.yaml"  # our Config; the engine's own settings are in config.json
TEXT_FOLDER = "vocab"
# Every ModelConfig field the export reproduces. A new model switch is refused (unless left at its
# default) until the export learns it: a wrong model is worse than no model.
EXPORTED_FIELDS = frozenset({"N", "N_dec", "d_model", "d_ff", "h", "dropout", "attention_dropout",
                             "activation_dropout", "norm_first", "tie_embeddings", "attention_kernel",
                             "max_positions", "layer_norm_eps"})  # dropout: training only, nothing to convert


def import_ctranslate2() -> Any:
    """The ctranslate2 module, or one ExportError line saying how to install it."""
    from ..runtime.errors import interrupt_after

    try:
        with interrupt_after():
            import ctranslate2
    except ImportError:
        raise ExportError("ctranslate2 is not installed; run `uv sync --extra ctranslate2` "
                          "(or `pip install ctranslate2`)") from None
    return ctranslate2


def check_exportable(cfg: Config) -> None:
    """Refuse, in one line, a model with a switch CTranslate2 has no equivalent for."""
    sections = [("model", cfg.model, EXPORTED_FIELDS)] + [(name, getattr(cfg, name), frozenset())
                                                          for name in MODEL_EXTENSIONS]
    for section, values, exported in sections:
        for field in dataclasses.fields(values):
            value = getattr(values, field.name)
            default = field.default_factory() if field.default is dataclasses.MISSING else field.default
            if field.name not in exported and value != default:
                raise ExportError(f"{section}.{field.name}={value!r} has no CTranslate2 equivalent; "
                                  "export a model trained without it")


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _set_linear(spec: Any, *linears: torch.nn.Linear) -> None:
    """One engine linear from one or more of ours stacked on the output dimension (fused projections)."""
    spec.weight = _array(torch.cat([lin.weight for lin in linears], dim=0))  # (sum out, in)
    spec.bias = _array(torch.cat([lin.bias for lin in linears], dim=0))


def _set_norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_attention(spec: Any, attn: MultiHeadedAttention, norm: torch.nn.LayerNorm, self_attention: bool) -> None:
    """Our W^Q, W^K, W^V, W^O as the engine's fused linears, with the sublayer's LayerNorm."""
    q, k, v, o = attn.linears
    if self_attention:
        _set_linear(spec.linear[0], q, k, v)  # (3d, d)
        _set_linear(spec.linear[1], o)
    else:
        _set_linear(spec.linear[0], q)
        _set_linear(spec.linear[1], k, v)  # (2d, d): keys and values of the memory
        _set_linear(spec.linear[2], o)
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec: Any, layer: torch.nn.Module, norm: torch.nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, layer.feed_forward.w_1)
    _set_linear(spec.linear_1, layer.feed_forward.w_2)
    _set_norm(spec.layer_norm, norm)


def _set_embeddings(table: Any, positions: Any, embed: torch.nn.Sequential) -> None:
    """Token table (scaled by sqrt(d_model) in the engine, as in `Embeddings`) and our positional table."""
    table.weight = _array(embed[0].lut.weight)  # (V, d)
    positions.encodings = _array(embed[1].pe[0])  # (max_positions, d)


def build_spec(model: EncoderDecoder, cfg: Config, src_itos: list[str], tgt_itos: list[str]) -> Any:
    """A CTranslate2 `TransformerSpec` holding `model`'s weights and vocabularies (`cfg`: its training config)."""
    ct2 = import_ctranslate2()
    specs = ct2.specs
    check_exportable(cfg)
    model_cfg = cfg.model
    pre_norm, h = model_cfg.norm_first, model_cfg.h
    enc_layers, dec_layers = model.encoder.layers, model.decoder.layers
    encoder = specs.TransformerEncoderSpec(len(enc_layers), h, pre_norm=pre_norm)
    decoder = specs.TransformerDecoderSpec(len(dec_layers), h, pre_norm=pre_norm)
    _set_embeddings(encoder.embeddings[0], encoder.position_encodings, model.src_embed)
    _set_embeddings(decoder.embeddings, decoder.position_encodings, model.tgt_embed)
    for spec, layer in zip(encoder.layer, enc_layers):
        _set_attention(spec.self_attention, layer.self_attn, layer.sublayer[0].norm, self_attention=True)
        _set_ffn(spec.ffn, layer, layer.sublayer[1].norm)
    for spec, layer in zip(decoder.layer, dec_layers):
        _set_attention(spec.self_attention, layer.self_attn, layer.sublayer[0].norm, self_attention=True)
        _set_attention(spec.attention, layer.src_attn, layer.sublayer[1].norm, self_attention=False)
        _set_ffn(spec.ffn, layer, layer.sublayer[2].norm)
    if pre_norm:
        _set_norm(encoder.layer_norm, model.encoder.norm)
        _set_norm(decoder.layer_norm, model.decoder.norm)
    _set_linear(decoder.projection, model.generator.proj)  # (V_tgt, d) + bias
    spec = specs.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = model_cfg.layer_norm_eps
    spec.config.add_source_bos = spec.config.add_source_eos = True  # our sources are <s> ... </s>
    spec.register_source_vocabulary(list(src_itos))
    spec.register_target_vocabulary(list(tgt_itos))
    return spec


def export_ctranslate2(model: EncoderDecoder, text: Any, config: Config, out_dir: str | Path,
                       quantization: str = "float32", overwrite: bool = False,
                       log: Callable[[str], None] | None = None) -> Path:
    """Write `model` (with its text pipeline and config) as a CTranslate2 model folder; return its path.

    An existing `out_dir` is refused unless `overwrite`, and even then it is replaced only when it is an earlier
    export (`check_export_out`). The folder is built beside `out_dir` and renamed into place, so a failed export
    leaves whatever was there before, or nothing. `log` gets a warning's text (a Python warning without it).
    """
    from ..config import config_yaml
    from ..runtime.errors import terminate_raises
    from ..runtime.files import give_default_permissions

    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    out = Path(out_dir)
    check_export_out(out, overwrite)
    spec = build_spec(model, config, text.src_vocab.itos, text.tgt_vocab.itos)
    spec.validate()
    spec.optimize(quantization=quantization)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with terminate_raises():  # a SIGTERM while the folder is written removes it, as an error does
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
            try:
                spec.save(str(tmp))
                (tmp / CONFIG_FILE).write_text(config_yaml(config), encoding="utf-8")
                text.save(tmp / TEXT_FOLDER)
                give_default_permissions(tmp)
                check_export_out(out, overwrite)  # again: the conversion took a while, and the folder may have changed
                _replace_folder(tmp, out, log)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # ours: made by mkdtemp above
                raise
    except OSError as exc:
        raise ExportError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; "
                          "check the path and free space, or choose another --out") from None
    return out


# Every name an export folder holds: CTranslate2's files, ours (config.yaml, vocab/), and what evaluate writes in
# it (its hypotheses, the temporary of a killed write of them, eval/). --overwrite replaces a folder that holds
# nothing else.
# evaluate's hypotheses of a split, in the export folder itself.
_HYPOTHESES = r"model\.[\w-]+(?:\.first\d+)?(?:\.alpha[\d.e+-]+)?\.beam\d+\.txt"
HYPOTHESES = re.compile(rf"^{_HYPOTHESES}$")
EXPORT_NAMES = re.compile(rf"""(?x)^(?:
    model\.bin | config\.json | (?:shared|source|target)_vocabulary(?:_\d+)?\.(?:json|txt) | vmap\.txt
  | config\.yaml | vocab
  | \.?{_HYPOTHESES}(?:\.[A-Za-z0-9_]{{6,}}\.tmp)? | eval
)$""")
# What evaluate writes in eval/: INPUT.beamK.txt, and the temporary of a killed write of one.
EVAL_NAMES = re.compile(r"^(?:.+\.beam\d+\.txt|\..+\.beam\d+\.txt\.[A-Za-z0-9_]{6,}\.tmp)$")


# The folders of an export and the names in each that export (vocab/) and evaluate (eval/) write.
INNER = {"eval": EVAL_NAMES, TEXT_FOLDER: TEXT_FILES}


def check_export_out(out: str | Path, overwrite: bool) -> None:
    """The rule for export's --out folder: a new one, an empty one, or (only with `overwrite`) an earlier export
    holding nothing but what export and evaluate write; anything else may hold a user's files and is refused."""
    from ..runtime.files import refuse_to_replace

    out = Path(out)
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return  # an empty folder (made for it, as for a training's train.out_dir): nothing to replace
    refuse_to_replace(out, overwrite)
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ExportError(f"{out} is not a folder written by export; --overwrite replaces only an earlier export: "
                          "choose another --out")
    found = _unknown_entries(out)
    if found is None:
        raise ExportError(f"{out} is not a folder written by export (no model.bin, config.json and {CONFIG_FILE}) and "
                          "may hold your files; --overwrite replaces only an earlier export: choose another --out")
    if found:
        raise ExportError(f"{out} holds {found[0]}, which export did not write; --overwrite replaces only an earlier "
                          "export: move it out of the folder, or choose another --out")


def _unknown_entries(folder: Path) -> list[str] | None:
    """The entries of `folder` that no export wrote (eval/'s and vocab/'s counted by name); None when it is no
    export at all.
    An empty folder is an export with nothing in it: replacing it loses nothing."""
    names = sorted(p.name for p in folder.iterdir())
    if names and not all((folder / n).is_file() for n in ("model.bin", "config.json", CONFIG_FILE)):
        return None
    unknown = [n for n in names if not EXPORT_NAMES.match(n)]
    for name, own in INNER.items():
        inner = folder / name
        if inner.is_dir() and not inner.is_symlink():
            unknown += [f"{name}/{p.name}" for p in sorted(inner.iterdir()) if not own.match(p.name) or p.is_dir()]
        elif inner.exists() or inner.is_symlink():
            unknown.append(name)
    return unknown


def _replace_folder(new: Path, out: Path, log: Callable[[str], None] | None = None) -> None:
    """Rename `new` to `out`; an old `out` (an earlier export) is moved aside first and, after the swap, emptied of
    the names an export holds and removed; anything else that appeared in it meanwhile stays there. Once the new
    export is in place, an old copy that cannot be deleted (a read-only folder) is a warning, not a failure."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    try:
        os.replace(new, out)
    except OSError:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        try:
            _remove_export(old)
        except OSError as exc:
            line = (f"the earlier export, moved aside to {old}, could not be deleted ({exc.strerror or exc}); "
                    "delete it yourself")
            if log is None:
                warnings.warn(line, stacklevel=3)
            else:
                log(line)


def evaluations_in(folder: str | Path) -> list[str]:
    """The hypotheses files evaluate wrote in an export folder (model.SPLIT.beamK.txt, eval/INPUT.beamK.txt): what
    replacing the export removes besides the export itself, as they are the replaced model's translations."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p.name for p in folder.iterdir() if p.is_file() and HYPOTHESES.match(p.name)]
    inner = folder / "eval"
    if inner.is_dir() and not inner.is_symlink():
        found += [f"eval/{p.name}" for p in inner.iterdir() if p.is_file() and EVAL_NAMES.match(p.name)
                  and not p.name.startswith(".")]  # not a killed write's temporary
    return sorted(found)


def _remove_export(folder: Path) -> None:
    """Delete what an export folder holds, by name (`EXPORT_NAMES`), then the folder if that left it empty."""
    for entry in folder.iterdir():
        if not EXPORT_NAMES.match(entry.name):
            continue
        if entry.name in INNER and entry.is_dir() and not entry.is_symlink():  # eval/, vocab/: their files by name
            for p in entry.iterdir():
                if INNER[entry.name].match(p.name) and not p.is_dir():
                    p.unlink(missing_ok=True)
            _rmdir_if_empty(entry)
        elif not entry.is_dir() or entry.is_symlink():
            entry.unlink(missing_ok=True)
    _rmdir_if_empty(folder)


def _rmdir_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # not empty: what is left is not ours to delete
        pass
