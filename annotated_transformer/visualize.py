"""The work behind scripts/visualize.py: translate one sentence and chart what the model attended to.

    from annotated_transformer import Translator
    from annotated_transformer.visualize import sentence_attention, visualize_sentence

    tr = Translator.from_checkpoint("runs/base/best.pt")
    sa = sentence_attention(tr, "Ein Mann fährt Fahrrad.")   # translation, tokens, every attention map
    sa.grid(layer=0, kind="src")                              # one layer's decoder-source heads (a chart)
    visualize_sentence(tr, "Ein Mann fährt Fahrrad.", "viz/", layer_numbers=[1, 6])   # files + index.html

The attention maps come from one teacher-forced pass over (source, <s> + translation), not from
the decoding itself: cached decoding runs the decoder one position at a time, so its last
`.attn` holds only the final step's row.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import altair as alt
import torch
from torch import Tensor

from . import visualization as viz
from .files import atomic_write
from .errors import UserError
from .translator import Translator, translate_ids

SPM_SPACE = "\u2581"  # SentencePiece's word-start marker
FORMATS = ("html", "png")


def display_token(token: str) -> str:
    """A token as a chart label: SentencePiece's word-start marker removed (a lone marker is kept)."""
    return token.replace(SPM_SPACE, "") or token


# A grid row of about this many pixels still reads on a screen; wider grids wrap to fewer columns.
GRID_ROW_PX = 2400


def grid_columns(sa: SentenceAttention, kind: str, most: int = 4) -> int:
    """How many heads fit side by side within GRID_ROW_PX for this sentence (1 to `most`)."""
    n_keys = len(sa.tgt_tokens) if kind == "self" else len(sa.src_tokens)
    head_px = max(viz.CELL_PX * n_keys, 120) + 80  # the map plus its axis labels
    return max(1, min(most, GRID_ROW_PX // head_px))


@dataclass
class SentenceAttention:
    """One sentence, its translation, and every attention map of the teacher-forced pass over both.

    src_ids are the encoder's input (<s> ... </s>); tgt_ids the decoder's input (<s> + the
    translation, no </s>: the last position is the one that predicted </s>). The token lists
    label the same positions for display. attention: {"encoder": [(h, S, S)] * N,
    "self": [(h, T, T)] * N, "src": [(h, T, S)] * N}, as `visualization.collect_attention`.
    """

    sentence: str
    translation: str
    src_ids: list[int]
    tgt_ids: list[int]
    src_tokens: list[str]
    tgt_tokens: list[str]
    attention: dict[str, list[Tensor]] = field(repr=False)
    truncated: bool = False

    @property
    def n_layers(self) -> int:
        """Encoder (= decoder) layers of the model."""
        return len(self.attention["encoder"])

    def grid(self, layer: int, kind: viz.AttentionKind, heads: Sequence[int] | None = None,
             columns: int | None = None) -> alt.ConcatChart:
        """The heads (default all) of one layer (0-based) for kind "encoder", "self" or "src".

        columns: heads per grid row; by default as many as fit in about GRID_ROW_PX pixels.
        """
        columns = columns or grid_columns(self, kind)
        return viz.attention_maps_grid(self.attention, layer, kind, self.src_tokens, self.tgt_tokens,
                                       heads=heads, columns=columns)


def _source_labels(translator: Translator, sentence: str, ids: list[int]) -> list[str]:
    """A label per source id: the vocabulary's token, or, for an unknown word, the word as typed."""
    text = translator.text
    labels = text.vocab("src").lookup_tokens(ids)
    if text.mode == "word":
        # ids = <s>, one id per word (cut to max_len with </s> kept), </s>: word k sits at position k + 1.
        words = text.tokenize(sentence, "src")
        for pos, word in enumerate(words[: len(ids) - 2], start=1):
            if ids[pos] == text.unk_id:
                labels[pos] = f"{word} (unk)"  # the model saw <unk>; the reader wants the word
    return [display_token(t) for t in labels]


def sentence_attention(translator: Translator, sentence: str, beam_size: int = 1) -> SentenceAttention:
    """Translate `sentence` (greedy, or beam search when beam_size > 1), then collect every attention map."""
    if not sentence.strip():
        raise UserError("the sentence is empty; give the source-language text to translate")
    if beam_size < 1:
        raise UserError(f"the beam size must be at least 1, got {beam_size}")
    text, dec = translator.text, translator.config.decode
    src_ids, truncated = translator.encode(sentence)
    out_ids = translate_ids(translator.model, [src_ids], pad=text.pad_id, bos=text.bos_id, eos=text.eos_id,
                            device=translator.device, beam_size=beam_size, alpha=dec.alpha,
                            max_len_a=dec.max_len_a, batch_size=1, amp_dtype=translator.amp_dtype)[0]
    tgt_ids = [text.bos_id, *out_ids]
    # lookup_tokens maps every id, so the labels stay aligned with the positions even if the
    # output holds an id that decode_tokens would drop.
    tgt_tokens = ["<s>", *(display_token(t) for t in text.vocab("tgt").lookup_tokens(out_ids))]
    attention = viz.collect_attention(translator.model, torch.tensor(src_ids), None, torch.tensor(tgt_ids))
    return SentenceAttention(sentence=sentence, translation=text.decode(out_ids, "tgt"), src_ids=src_ids,
                             tgt_ids=tgt_ids, src_tokens=_source_labels(translator, sentence, src_ids),
                             tgt_tokens=tgt_tokens, attention=attention, truncated=truncated)


def layer_indices(layer_numbers: Sequence[int] | None, n_layers: int) -> list[int]:
    """0-based indices of 1-based layer numbers (the charts' titles); None means every layer."""
    if not layer_numbers:
        return list(range(n_layers))
    bad = [n for n in layer_numbers if not 1 <= n <= n_layers]
    if bad:
        raise UserError(f"layer {bad[0]} does not exist: this model has {n_layers} layer"
                        f"{'s' if n_layers > 1 else ''}, numbered 1 to {n_layers}")
    return sorted({n - 1 for n in layer_numbers})


def teaching_charts() -> list[tuple[str, str, alt.TopLevelMixin]]:
    """(file stem, heading, chart) of the model-independent charts, in the notebook's order."""
    return [
        ("mask", "The subsequent mask", viz.mask_chart()),
        ("positional_encoding", "Positional encoding", viz.positional_encoding_chart()),
        ("lr_schedule", "Learning-rate schedule", viz.lr_schedule_chart()),
        ("label_smoothing", "Label smoothing", viz.label_smoothing_chart()),
        ("loss_penalty", "Label smoothing penalises over-confidence", viz.loss_penalty_chart()),
    ]


_KIND_FILES = {"encoder": "encoder_self", "self": "decoder_self", "src": "decoder_src"}
_KIND_HEADINGS = {"encoder": "encoder self-attention", "self": "decoder self-attention",
                  "src": "decoder-source attention"}


def attention_charts(sa: SentenceAttention, layers: Sequence[int]) -> list[tuple[str, str, alt.TopLevelMixin]]:
    """(file stem, heading, chart) of the three attention grids of each 0-based layer in `layers`."""
    return [(f"attention_layer{layer + 1}_{_KIND_FILES[kind]}", f"Layer {layer + 1}: {_KIND_HEADINGS[kind]}",
             sa.grid(layer, kind))
            for layer in layers for kind in viz.ATTENTION_KINDS]


@dataclass
class Visualization:
    """What `visualize_sentence` produced."""

    attention: SentenceAttention
    files: list[Path]  # every chart file, then index.html
    index: Path
    warnings: list[str] = field(default_factory=list)  # charts that were skipped, and why


def visualize_sentence(translator: Translator, sentence: str, out_dir: str | Path,
                       layer_numbers: Sequence[int] | None = None, beam_size: int = 1,
                       formats: Sequence[str] = FORMATS, metrics: str | Path | None = None) -> Visualization:
    """Translate `sentence` and write every chart into `out_dir`, plus an index.html linking them.

    Charts: the encoder self-, decoder self- and decoder-source attention (all heads) of each
    layer in `layer_numbers` (1-based, as in the chart titles; default every layer), the teaching
    charts, and the training curves when a metrics.jsonl path is given.
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
    sa = sentence_attention(translator, sentence, beam_size)

    charts = [*attention_charts(sa, layers), *teaching_charts()]
    warnings = []
    if metrics is not None:
        try:
            charts.append(("training_curves", "Training curves", viz.training_curves_chart(metrics)))
        except (OSError, ValueError) as exc:  # the curves are extra: never lose the other charts over them
            warnings.append(f"no training curves from {metrics} ({exc})")
    written: list[Path] = []
    entries: list[tuple[str, list[Path]]] = []
    try:
        for stem, heading, chart in charts:
            paths = viz.save_chart(chart, out / stem, formats=formats)
            written += paths
            entries.append((heading, paths))
        index = write_index(out, sa, entries, n_attention=3 * len(layers))
    except OSError as exc:
        raise UserError(f"cannot write the charts into {out}: {exc.strerror or exc}") from None
    return Visualization(attention=sa, files=[*written, index], index=index, warnings=warnings)


def visualize_checkpoint(checkpoint: str | Path, sentence: str, out_dir: str | Path,
                         layer_numbers: Sequence[int] | None = None, beam_size: int = 1,
                         formats: Sequence[str] = FORMATS, device: str | None = None) -> Visualization:
    """`visualize_sentence` for a checkpoint file, with the training curves of its run directory if present."""
    if not sentence.strip():  # checked before loading the model: a typo should cost nothing
        raise UserError("the sentence is empty; give the source-language text to translate with --sentence")
    translator = Translator.from_checkpoint(checkpoint, device=device)
    metrics = Path(checkpoint).parent / "metrics.jsonl"  # the run directory's, beside best.pt
    return visualize_sentence(translator, sentence, out_dir, layer_numbers, beam_size, formats,
                              metrics if metrics.is_file() else None)


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
                head = f.read(24)
            width = int.from_bytes(head[16:20], "big") // 2  # the IHDR chunk's width
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
        "<p>In every map a row is a query position and a column a key position; a row's weights sum to 1. "
        "The HTML charts show each weight on hover.</p>",
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
