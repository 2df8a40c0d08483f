"""Charts as offline HTML (the Vega JavaScript inlined, or in one file beside the pages) and PNG: in files,
and inline in Jupyter.

    save_chart              <path>.html and <path>.png
    chart_html              the HTML of one chart: a fragment for a notebook output or a whole page
    enable_notebook_charts  Jupyter shows each chart interactive (HTML) with a PNG beside it

Both need nothing from the internet: vl-convert bundles Vega, Vega-Lite and vega-embed into one
script, which every HTML chart carries, or a folder of charts holds once (`SCRIPT_FILE`, which its
pages load by a relative path), and draws the PNGs on this machine.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import altair as alt

from ..runtime.files import USER_CACHE, atomic_write

FORMATS = ("html", "png")
NOTEBOOK_RENDERER = "annotated_transformer"
# How vega-embed draws: SVG keeps text sharp at any zoom, as vl-convert's own HTML pages do.
EMBED_OPTIONS = {"renderer": "svg"}
# The Vega JavaScript of a folder of charts, shared by its pages (save_chart's `shared_script`).
SCRIPT_FILE = "vega.js"
# vl-convert assembles that script anew in every process (over a second on a small CPU, at the end of every
# training run, for its charts), so a copy is kept per vl-convert and Vega-Lite version.
SCRIPT_CACHE = Path(USER_CACHE).expanduser() / "vega"


def _vegalite_version() -> str | None:
    """The Vega-Lite version altair writes (e.g. '6.4'), when vl-convert bundles it; else None (its latest)."""
    import vl_convert as vlc

    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vlc.get_vegalite_versions() else None


@functools.cache
def _vega_script() -> str:
    """vega-embed, Vega-Lite and Vega in one script (about 0.9 MB) that runs once per page however often it appears.

    The bundle declares top-level constants, so a second copy on the same page (the next chart of a
    notebook) would stop with "Identifier has already been declared". Inside a function they are local;
    the bundle sets window.vegaEmbed itself, and the guard skips it once that exists.
    """
    bundle = _vega_bundle()
    if "</script" in bundle.lower():  # would end the <script> element early
        raise ValueError("the Vega JavaScript bundle cannot be inlined: it contains '</script'")
    return f"(function () {{\nif (window.vegaEmbed) return;\n{bundle}\n}})();"


def _vega_bundle() -> str:
    """vl-convert's JavaScript bundle, from SCRIPT_CACHE when a copy of this version is there (kept best effort)."""
    import vl_convert as vlc

    version = _vegalite_version()
    path = SCRIPT_CACHE / f"vl-convert-{getattr(vlc, '__version__', 'unknown')}-vega-lite-{version or 'latest'}.js"
    try:
        kept = path.read_text(encoding="utf-8")
        if "vegaEmbed" in kept:  # anything else (emptied, cut short by another program): made again
            return kept
    except (OSError, UnicodeDecodeError):
        pass
    bundle = vlc.javascript_bundle(vl_version=version)
    try:
        atomic_write(path, lambda f: f.write(bundle.encode("utf-8")))
    except OSError:  # a read-only or full home: the charts are made all the same
        pass
    return bundle


def _script_json(value: Any) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' that could close it (a token '</script>')."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _title(spec: dict) -> str | None:
    title = spec.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    return " ".join(text) if isinstance(text, list) else text


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels, from the IHDR chunk of a PNG file's first 24 bytes."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def chart_png(spec: dict, scale: float = 2.0) -> bytes:
    """The Vega-Lite `spec` drawn as a PNG on this machine; `scale` multiplies its pixel size."""
    import vl_convert as vlc

    return vlc.vegalite_to_png(spec, vl_version=_vegalite_version(), scale=scale)


def chart_html(spec: dict, *, page: bool = True, fallback_png: bytes | None = None,
               png_scale: float = 2.0, script_src: str | None = None) -> str:
    """The Vega-Lite `spec` as HTML that draws it with the inlined Vega JavaScript: no internet needed.

    page: a whole document (a .html file) rather than a fragment for a notebook output. Fragments
    can share a page: each draws into its own uniquely named element. fallback_png: shown until the
    chart is drawn, and where JavaScript does not run (a viewer that renders HTML but no scripts);
    drawn at 1/`png_scale` of its pixel size. script_src: load the Vega JavaScript from this relative
    path (a file written by `write_script`) instead of inlining it.
    """
    div = f"vega-chart-{uuid.uuid4().hex}"
    title = _title(spec)
    library = f'<script type="text/javascript" src="{html.escape(script_src)}"></script>\n' if script_src else ""
    fallback = ""
    if fallback_png is not None:
        width = png_size(fallback_png)[0] / png_scale
        data = base64.b64encode(fallback_png).decode("ascii")
        fallback = (f'<img src="data:image/png;base64,{data}" width="{width:g}" '
                    f'alt="{html.escape(title or "chart")}">')
    fragment = f"""<style>
  #{div}.vega-embed {{ width: 100%; display: flex; }}
  #{div}.vega-embed details, #{div}.vega-embed details summary {{ position: relative; }}
</style>
<div id="{div}">{fallback}</div>
{library}<script type="text/javascript">
{"" if script_src else _vega_script()}
(function () {{
  let el = document.currentScript && document.currentScript.previousElementSibling;
  if (!el || el.id !== "{div}") el = document.getElementById("{div}");
  const spec = {_script_json(spec)};
  const opts = {_script_json(EMBED_OPTIONS)};
  vegaEmbed(el, spec, opts).catch(console.error);
}})();
</script>"""
    if not page:
        return fragment
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title or 'chart')}</title>\n</head>\n<body>\n{fragment}\n</body>\n</html>\n")


def write_script(folder: str | Path) -> Path:
    """The Vega JavaScript as `SCRIPT_FILE` in `folder`, for its pages to share; left as it is when it holds that."""
    path = Path(folder) / SCRIPT_FILE
    data = _vega_script().encode("utf-8")
    if not path.is_file() or path.read_bytes() != data:
        atomic_write(path, lambda f: f.write(data))
    return path


def save_chart(chart: alt.TopLevelMixin, path_without_suffix: str | Path,
               formats: Sequence[str] = FORMATS, scale: float = 2.0, shared_script: bool = False) -> list[Path]:
    """Write `chart` as `<path>.html` (Vega JavaScript inlined, opens offline) and `<path>.png`.

    `scale` multiplies the PNG's pixel size. `shared_script`: the page loads the Vega JavaScript from
    `SCRIPT_FILE` beside it (`write_script`, which the caller runs once for the folder) instead of
    carrying a copy, for a folder of many charts. Each file is written whole or not at all. Returns
    the written paths.
    """
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown chart formats {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    with alt.data_transformers.disable_max_rows():  # scoped: restored when the block ends
        spec = chart.to_dict()
    base = Path(path_without_suffix)
    written = []
    for fmt in formats:
        if fmt == "html":
            data = chart_html(spec, script_src=SCRIPT_FILE if shared_script else None).encode("utf-8")
        else:
            data = chart_png(spec, scale)
        # Append the suffix rather than with_suffix(): a name like "layer.1" must keep its dot.
        path = base.with_name(f"{base.name}.{fmt}")
        atomic_write(path, lambda f, data=data: f.write(data))
        written.append(path)
    return written


def _notebook_bundle(spec: dict, png_scale: float = 2.0, interactive: bool = True,
                     **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chart as a Jupyter output: interactive HTML with the Vega JavaScript inlined, and a PNG.

    Front ends that run JavaScript (JupyterLab, Notebook, VS Code, nbviewer, nbconvert's HTML)
    pick the HTML: tooltips with the values, and no internet needed. The PNG stays in the bundle
    (and inside the HTML, until the chart is drawn) for viewers without JavaScript.

    Altair's own renderers do not do this: its default HTML fetches Vega from a CDN; its "inline"
    template declares the same top-level constants in every chart, so the second chart of a page
    fails; JupyterLab's built-in Vega-Lite renderer takes version 5 specs while altair 6 writes 6.
    """
    png = chart_png(spec, png_scale)
    width, height = png_size(png)
    bundle: dict[str, Any] = {"image/png": png, "text/plain": f"<chart: {_title(spec) or 'untitled'}>"}
    if interactive:
        bundle["text/html"] = chart_html(spec, page=False, fallback_png=png, png_scale=png_scale)
    # Show the PNG at its logical size: sharp on high-density screens, not twice as large.
    return bundle, {"image/png": {"width": width / png_scale, "height": height / png_scale}}


def enable_notebook_charts(png_scale: float = 2.0, interactive: bool = True) -> None:
    """Show charts in Jupyter, drawn without internet: interactive HTML plus a PNG; call once per notebook.

    Each chart output carries its own copy of the Vega JavaScript (about 0.9 MB), so a notebook
    saved with its outputs is large; interactive=False keeps only the PNGs.
    """
    if NOTEBOOK_RENDERER not in alt.renderers.names():
        alt.renderers.register(NOTEBOOK_RENDERER, _notebook_bundle)
    alt.renderers.enable(NOTEBOOK_RENDERER, png_scale=png_scale, interactive=interactive)
