"""Our decoder against CTranslate2 on the same trained weights (scripts/benchmark.py --engines).

Every engine translates test2016 in its own fresh process (so its peak memory is its own), with
the same number of threads, the same batch size and the same output-length limit:

  torch-fp32   our batched, cached greedy search and beam search (`Translator`), fp32
  torch-bf16   the same with bf16 weights (`Translator.to_bf16`; only where the CPU has native bf16)
  torch-int8   the same after PyTorch's dynamic int8 quantisation of every nn.Linear (--quantize int8)
  ct2-float32  the model exported by `ct2_export` (float32 weights), CTranslate2's decoder
  ct2-int8     the same export with int8 weights

Per engine: sentences/s for greedy and beam `beam` (after a warm-up batch), the median latency of
one sentence translated alone (batch 1: what an interactive user waits), peak resident memory,
greedy test BLEU (detokenised, cased sacreBLEU, as evaluate.py) and the share of sentences whose
greedy output equals torch-fp32's word for word.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ENGINES = ("torch-fp32", "torch-bf16", "torch-int8", "ct2-float32", "ct2-int8")


def _load(engine: str, checkpoint: str, folders: dict[str, str], threads: int) -> Any:
    torch.set_num_threads(threads)
    if engine.startswith("ct2-"):
        from ..deploy.ct2_translator import CT2Translator

        return CT2Translator.from_dir(folders[engine], threads=threads)
    from ..deploy.translator import Translator

    tr = Translator.from_checkpoint(checkpoint, device="cpu")
    if engine == "torch-bf16":
        tr.to_bf16()
    elif engine == "torch-int8":
        tr.quantize_int8()
    return tr


def measure_engine(engine: str, checkpoint: str, folders: dict[str, str], sources: list[str], threads: int,
                   beam: int, latency_sentences: int) -> dict[str, Any]:
    """One engine's figures on `sources` (see the module docstring); its greedy outputs included."""
    from .hardware import process_peak_memory_gb

    tr = _load(engine, checkpoint, folders, threads)
    tr.translate(sources[:16])  # warm-up: kernel choice, allocator, the engine's first-call costs
    t0 = time.perf_counter()
    greedy = tr.translate(sources, beam=1)
    t_greedy = time.perf_counter() - t0
    t0 = time.perf_counter()
    tr.translate(sources, beam=beam)
    t_beam = time.perf_counter() - t0
    stride = max(1, len(sources) // max(latency_sentences, 1))
    latencies = []
    for s in sources[::stride][:latency_sentences]:
        t0 = time.perf_counter()
        tr.translate([s], beam=1)
        latencies.append(time.perf_counter() - t0)
    return {"engine": engine, "threads": threads, "greedy_per_s": len(sources) / t_greedy,
            f"beam{beam}_per_s": len(sources) / t_beam, "latency_ms": 1000 * statistics.median(latencies),
            "peak_mem_gb": process_peak_memory_gb(torch.device("cpu")), "greedy": greedy}


def compare_engines(checkpoint: str, engines: tuple[str, ...] = ENGINES, beam: int = 5, latency_sentences: int = 100,
                    limit: int | None = None, data_root: str | None = None, log: Any = print) -> dict[str, Any]:
    """Export the checkpoint twice (float32, int8), measure every engine on test2016; rows with ratios to torch-fp32."""
    from ..data import read_split, resolve_multi30k_dir
    from ..deploy.ct2_export import export_ctranslate2
    from ..deploy.translator import Translator
    from ..runtime.device import native_bf16
    from ..scoring import score_translations
    from .hardware import in_fresh_process

    tr = Translator.from_checkpoint(checkpoint, device="cpu")
    if data_root:
        tr.config.data.root = data_root
    sources, refs = read_split(resolve_multi30k_dir(tr.config.data), "test", tr.config.data.src_lang,
                               tr.config.data.tgt_lang)
    sources, refs = (sources[:limit], refs[:limit]) if limit else (sources, refs)
    if not native_bf16(torch.device("cpu")):
        engines = tuple(e for e in engines if e != "torch-bf16")
    threads = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory(prefix="engines-") as tmp:
        folders = {}
        for q in ("float32", "int8"):
            if f"ct2-{q}" in engines:
                folders[f"ct2-{q}"] = str(export_ctranslate2(tr.model, tr.text, tr.config, Path(tmp) / q,
                                                             quantization=q))
        for engine in engines:
            log(f"  {engine} ...")
            rows.append(in_fresh_process(f"engine {engine}", measure_engine, engine, checkpoint, folders, sources,
                                         threads, beam, latency_sentences))
    base = next((r for r in rows if r["engine"] == "torch-fp32"), rows[0])
    for r in rows:
        r["bleu"] = score_translations(r["greedy"], refs, tr.text)[0].score
        r["same_as_torch_fp32"] = sum(a == b for a, b in zip(r["greedy"], base["greedy"])) / len(sources)
    add_ratios(rows, beam)
    for r in rows:
        del r["greedy"]  # kept out of engines.json
    return {"checkpoint": checkpoint, "sentences": len(sources), "beam": beam, "threads": threads, "rows": rows}


def add_ratios(rows: list[dict[str, Any]], beam: int) -> None:
    """Each row's speeds as ratios to torch-fp32's (the first row when it is absent); latency inverted, so >1 is
    faster."""
    base = next((r for r in rows if r["engine"] == "torch-fp32"), rows[0])
    for r in rows:
        r["greedy_ratio"] = r["greedy_per_s"] / base["greedy_per_s"]
        r[f"beam{beam}_ratio"] = r[f"beam{beam}_per_s"] / base[f"beam{beam}_per_s"]
        r["latency_ratio"] = base["latency_ms"] / r["latency_ms"]


def median_rows(rounds: list[list[dict[str, Any]]], beam: int) -> list[dict[str, Any]]:
    """Per engine, the median of each speed over the rounds; BLEU and agreement from the first (deterministic)."""
    rows = []
    for i, first in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        row = dict(first)
        for key in ("greedy_per_s", f"beam{beam}_per_s", "latency_ms", "peak_mem_gb"):
            row[key] = statistics.median(r[key] for r in same)
            row[key + "_all"] = [r[key] for r in same]
        rows.append(row)
    add_ratios(rows, beam)
    return rows


def format_engines(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (speeds and ratios to torch-fp32)."""
    k = result["beam"]
    lines = [f"| engine | greedy sent/s | beam {k} sent/s | batch-1 latency ms | peak mem GB | greedy BLEU | "
             "same output as torch-fp32 |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['engine']} | {r['greedy_per_s']:.1f} ({r['greedy_ratio']:.2f}x) | "
                     f"{r[f'beam{k}_per_s']:.1f} ({r[f'beam{k}_ratio']:.2f}x) | {r['latency_ms']:.1f} "
                     f"({r['latency_ratio']:.2f}x) | {r['peak_mem_gb']:.2f} | {r['bleu']:.2f} | "
                     f"{100 * r['same_as_torch_fp32']:.1f}% |")
    return "\n".join(lines)
