"""The work behind scripts/visualize.py: one sentence's charts written to a folder, with an index.html.

    from annotated_transformer import Translator
    from annotated_transformer.visualization import visualize_sentence

    tr = Translator.from_checkpoint("runs/base")             # a run directory, or a model file
    visualize_sentence(tr, "Ein Mann fährt Fahrrad.", "viz/", layer_numbers=[1, 6])   # files + index.html
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from warnings import catch_warnings, simplefilter

from ..deploy.text_translator import TruncationWarning
from ..deploy.translator import Translator
from ..runtime.errors import UserError
from ..runtime.files import atomic_write, refuse_to_replace
from .attention import KINDS, SentenceAttention, attention_charts, layer_indices, sentence_attention
from .rendering import FORMATS, SCRIPT_FILE, png_size, save_chart, write_script
from .teaching import teaching_charts
from .training_curves import training_curves_chart


ATTENTION_STEM = re.compile(r"attention_layer[0-9]+_(?:" + "|".join(info.file for info in KINDS.values()) + ")")


@dataclass
class Visualization:
    """What `visualize_sentence` produced."""

    attention: SentenceAttention
    files: list[Path]  # the charts' shared JavaScript (with HTML charts), every chart file, then index.html
    index: Path
    warnings: list[str] = field(default_factory=list)  # charts that were skipped, and why


def visualize_sentence(translator: Translator, sentence: str, out_dir: str | Path,
                       layer_numbers: Sequence[int] | None = None, beam_size: int = 1,
                       formats: Sequence[str] = FORMATS, metrics: str | Path | None = None,
                       overwrite: bool = True) -> Visualization:
    """Translate `sentence` and write every chart into `out_dir`, plus an index.html linking them.

    Charts: the encoder self-, decoder self- and decoder-source attention (all heads) of each
    layer in `layer_numbers` (1-based, as in the chart titles; default every layer), the teaching
    charts, and the training curves when a metrics.jsonl path is given. The HTML charts share one
    copy of the Vega JavaScript in the folder (`rendering.SCRIPT_FILE`). With `overwrite` False (the visualize
    command without --overwrite) any of these files already in the folder is refused before one is written;
    other files there are never touched. With `overwrite`, the charts of an earlier visualize (those its index.html
    links to) that this one does not write again, of other layers or formats, are removed, so that the folder holds
    one sentence's charts.
    """
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise UserError(f"unknown chart format {unknown[0]!r}; choose from {', '.join(FORMATS)}" if unknown
                        else f"no chart format chosen; choose from {', '.join(FORMATS)}")
    formats = list(dict.fromkeys(formats))  # "png png" writes once
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder; choose another output folder")
    layers = layer_indices(layer_numbers, len(translator.model.encoder.layers))  # before any work is done
    with catch_warnings():  # a cut sentence is `attention.truncated` in the result, for the caller to say
        simplefilter("ignore", TruncationWarning)
        sa = sentence_attention(translator, sentence, beam_size)

    charts = [*attention_charts(sa, layers), *teaching_charts()]
    warnings = []
    if metrics is not None:
        try:
            charts.append(("training_curves", "Training curves", training_curves_chart(metrics)))
        except (OSError, ValueError) as exc:  # the curves are extra: never lose the other charts over them
            warnings.append(f"no training curves from {metrics} ({exc})")
    names = ["index.html", *([SCRIPT_FILE] if "html" in formats else []),
             *(f"{stem}.{fmt}" for stem, _, _ in charts for fmt in formats)]
    for name in names:
        refuse_to_replace(out / name, overwrite)
    earlier = _charts_of_index(out / "index.html") if overwrite else set()
    written: list[Path] = []
    entries: list[tuple[str, list[Path]]] = []
    try:
        if "html" in formats:
            written.append(write_script(out))
        for stem, heading, chart in charts:
            paths = save_chart(chart, out / stem, formats=formats, shared_script=True)
            written += paths
            entries.append((heading, paths))
        index = write_index(out, sa, entries, n_attention=3 * len(layers))
    except OSError as exc:
        raise UserError(f"cannot write the charts into {out}: {exc.strerror or exc}") from None
    for name in sorted(earlier - set(names)):  # the earlier visualize's charts not written again: one sentence's
        try:
            (out / name).unlink()
        except OSError as exc:
            warnings.append(f"could not remove the earlier chart {out / name} ({exc.strerror or exc})")
    return Visualization(attention=sa, files=[*written, index], index=index, warnings=warnings)


def _charts_of_index(index: Path) -> set[str]:
    """The chart files an earlier visualize's index.html links to (and the JavaScript its HTML charts share), by the
    names visualize gives them and only where they are plain files: what it wrote, never a file of yours."""
    try:
        text = index.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    stems = {stem for stem, _, _ in teaching_charts()} | {"training_curves"}
    linked = set(re.findall(r'(?:href|src)="([^"/]+)"', text))
    if any(name.endswith(".html") for name in linked):
        linked.add(SCRIPT_FILE)
    charts = set()
    for name in map(html.unescape, linked):
        stem, _, fmt = name.rpartition(".")
        ours = (stem in stems or ATTENTION_STEM.fullmatch(stem)) and fmt in FORMATS or name == SCRIPT_FILE
        path = index.parent / name
        if ours and path.is_file() and not path.is_symlink():
            charts.add(name)
    return charts


def visualize_checkpoint(checkpoint: str | Path, sentence: str, out_dir: str | Path,
                         layer_numbers: Sequence[int] | None = None, beam_size: int | None = None,
                         formats: Sequence[str] = FORMATS, device: str | None = None,
                         overwrite: bool = True) -> Visualization:
    """`visualize_sentence` for a checkpoint file, with the training curves of its run directory if present;
    `beam_size=None` decodes as the checkpoint does (its decode.beam_size), as translate does."""
    if not sentence.strip():  # checked before loading the model: a typo should cost nothing
        raise UserError("the sentence is empty; give the source-language text to translate")
    translator = Translator.from_checkpoint(checkpoint, device=device)
    beam_size = translator.config.decode.beam_size if beam_size is None else beam_size
    metrics = Path(checkpoint).parent / "metrics.jsonl"  # the run directory's, beside its model files
    return visualize_sentence(translator, sentence, out_dir, layer_numbers, beam_size, formats,
                              metrics if metrics.is_file() else None, overwrite)


_INDEX_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
p { max-width: 70em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
.tokens { font-family: ui-monospace, monospace; font-size: 90%; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-weight: 600; margin-bottom: .4em; }
"""


def write_index(out_dir: Path, sa: SentenceAttention, entries: Sequence[tuple[str, Sequence[Path]]],
                n_attention: int) -> Path:
    """index.html: the sentence, its translation and tokens, then every chart (PNG inline, links to each file).

    Plain HTML with relative links and no scripts: it opens offline and survives moving the folder.
    The first `n_attention` entries are the attention grids; the rest are the other charts.
    """
    def figure(heading: str, paths: Sequence[Path]) -> str:
        links = " · ".join(f'<a href="{html.escape(p.name)}">{p.suffix[1:].upper()}</a>' for p in paths)
        png = next((p for p in paths if p.suffix == ".png"), None)
        img = ""
        if png is not None:
            # save_chart draws PNGs at twice their size: show them at their logical size (sharp, not huge).
            with png.open("rb") as f:
                width = png_size(f.read(24))[0] // 2
            img = f'<br><img src="{html.escape(png.name)}" width="{width}" alt="{html.escape(heading)}">'
        return f"<figure><figcaption>{html.escape(heading)} ({links})</figcaption>{img}</figure>"

    def tokens(labels: Sequence[str]) -> str:
        return html.escape(" · ".join(labels))

    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>Attention visualisation</title>", f"<style>{_INDEX_STYLE}</style></head><body>",
        "<h1>Attention visualisation</h1>",
        f"<p><b>Source:</b> {html.escape(sa.sentence)}</p>",
        f"<p><b>Translation:</b> {html.escape(sa.translation) or '<i>(empty)</i>'}</p>",
        f'<p><b>Source tokens</b> (encoder input): <span class="tokens">{tokens(sa.src_tokens)}</span></p>',
        f'<p><b>Target tokens</b> (decoder input): <span class="tokens">{tokens(sa.tgt_tokens)}</span></p>',
        ("<p>In every map a row is a query position and a column a key position; a row's weights sum to 1. "
         "The HTML charts show each weight on hover.</p>"),
        "<h2>What the model attends to</h2>",
        *(figure(h, p) for h, p in entries[:n_attention]),
        "<h2>The model's parts and its training</h2>",
        *(figure(h, p) for h, p in entries[n_attention:]),
        "</body></html>",
    ]
    path = out_dir / "index.html"
    data = ("\n".join(parts) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(data))
    return path
