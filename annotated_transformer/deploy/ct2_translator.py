"""`CT2Translator`: a model exported by `ct2_export.py` (scripts/export.py), translated by CTranslate2, not PyTorch.

    from annotated_transformer import Translator
    tr = Translator.load("exported/cpu_45min", beam=5)    # a CT2Translator, as CT2Translator.from_dir gives
    tr.translate("Ein Mann fährt Fahrrad.")
    tr.translate("Ein Mann fährt Fahrrad.", n_best=3)   # num_hypotheses=3, return_scores=True: Hypothesis objects

`Translator`'s interface and rules, from their shared `TextTranslator`: a sentence is encoded by the
run's own text pipeline (so truncation and unknown tokens are ours), handed to the engine as our
vocabulary's tokens, and the engine's tokens are detokenised by the pipeline again. Empty lines
give empty outputs; outputs keep the input order.

One difference in beam search: the engine divides a hypothesis' log-probability by |Y|^alpha,
ours by ((5 + |Y|) / 6)^alpha (GNMT), so beam outputs may differ slightly and n-best scores do
(greedy's too, unless alpha is 0); greedy search is the same computation. The engine keeps no
attention maps of every layer and head: `attention` is one line saying to load the model this
folder was exported from.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..config import Config, config_from_dict, read_yaml
from ..runtime.errors import ConfigError, ExportError, excerpt
from .ct2_export import CONFIG_FILE, TEXT_FOLDER, import_ctranslate2
from .text_translator import TextTranslator


class CT2Translator(TextTranslator):
    """An exported model folder, ready to translate text with CTranslate2 on the CPU."""

    def __init__(self, engine: Any, text: Any, config: Config, folder: Path) -> None:
        self.engine = engine
        self.text = text
        self.config = config
        self.folder = folder

    @classmethod
    def from_dir(cls, folder: str | Path, device: str = "cpu", threads: int | None = None) -> CT2Translator:
        """Load a folder written by `export_ctranslate2` (quantisation as exported) on "cpu", "cuda" or "cuda:N";
        `threads` defaults to torch's."""
        from ..data.text import TextPipeline

        ct2 = import_ctranslate2()
        path = Path(folder)
        missing = [name for name in ("model.bin", CONFIG_FILE, TEXT_FOLDER) if not (path / name).exists()]
        if missing:
            raise ExportError(f"{path} is not a model folder written by scripts/export.py ({missing[0]} is missing); "
                              "export a checkpoint with scripts/export.py --to ctranslate2")
        cfg = config_from_dict(read_yaml(path / CONFIG_FILE))  # a damaged file is one ConfigError line
        text = TextPipeline.load(path / TEXT_FOLDER)
        kind, colon, number = device.partition(":")
        numbered = number.isdecimal() and number.isascii()
        if kind not in ("cpu", "cuda") or (colon and not (kind == "cuda" and numbered)):
            raise ConfigError(f"--device {device} is not a CTranslate2 device; use cpu, cuda or cuda:N")
        index = int(number) if colon else 0
        gpus = ct2.get_cuda_device_count() if kind == "cuda" else 0
        if kind == "cuda" and gpus == 0:  # not the folder's fault: say so before loading
            raise ConfigError(f"--device {device}, but CTranslate2 finds no usable CUDA GPU here; use --device cpu")
        if kind == "cuda" and index >= gpus:
            raise ConfigError(f"--device {device}, but CTranslate2 finds {gpus} CUDA GPU{'s' if gpus > 1 else ''} "
                              f"here (cuda:0{f' to cuda:{gpus - 1}' if gpus > 1 else ''})")
        try:
            engine = ct2.Translator(str(path), device=kind, device_index=index, inter_threads=1,
                                    intra_threads=threads or torch.get_num_threads())
        except (RuntimeError, ValueError) as exc:
            raise ExportError(f"CTranslate2 cannot load {path}: {excerpt(exc)}; export the checkpoint again") from None
        return cls(engine, text, cfg, path)

    def translate_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int) -> list[list[int]]:
        """CTranslate2's greedy or beam search on source ids; output ids without <s> and </s>."""
        results = self._search(sources, beam_size, alpha, batch_size, n_best=1, scores=False)
        return [self.text.tgt_vocab.lookup_indices(r.hypotheses[0]) for r in results]

    def n_best_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int,
                   n_best: int) -> list[list[tuple[list[int], float]]]:
        """The engine's `n_best` hypotheses of each source with its scores (num_hypotheses, return_scores)."""
        results = self._search(sources, beam_size, alpha, batch_size, n_best=n_best, scores=True)
        return [[(self.text.tgt_vocab.lookup_indices(h), score) for h, score in zip(r.hypotheses, r.scores)]
                for r in results]

    def attention(self, sentence: str, *, beam: int | None = None, alpha: float | None = None) -> Any:
        """Not with CTranslate2: one ConfigError line (Translator.attention needs the PyTorch model)."""
        raise ConfigError(f"attention maps need the PyTorch model, which the exported folder {self.folder} does not "
                          "hold; load the run directory or model file it was exported from")

    def _search(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int, n_best: int,
                scores: bool) -> list[Any]:
        """The engine's TranslationResult of each source: `n_best` hypotheses each, with their scores if asked."""
        itos, dec = self.text.src_vocab.itos, self.config.decode
        # Our ids -> our tokens: the engine sees exactly the (truncated, <unk>-mapped) source we would.
        tokens = [[itos[i] for i in ids[1:-1]] for ids in sources]
        # Our limit: source length (with <s> and </s>) + max_len_a positions, counting the start symbol,
        # within the positional table; the engine counts generated tokens only, and takes one limit a call.
        limits = [min(len(ids) + dec.max_len_a, self.config.model.max_positions) - 1 for ids in sources]

        def search(group: list[int], limit: int) -> list[Any]:
            return self.engine.translate_batch(
                [tokens[i] for i in group], beam_size=beam_size, length_penalty=alpha, max_batch_size=batch_size,
                max_decoding_length=limit, min_decoding_length=0, max_input_length=0, num_hypotheses=n_best,
                return_scores=scores)

        # One call with the longest limit (a call a limit decodes beam search at half the speed). Greedy search:
        # each output cut at its own limit is exactly ours (a sentence's first n tokens do not depend on the
        # limit). Beam search, or scores asked: a sentence whose output reached its limit is searched again
        # within it (few, once a model is trained), where a beam that ran on might have chosen otherwise.
        results = search(list(range(len(sources))), max(limits, default=1))
        if beam_size == 1 and not scores:
            return [SimpleNamespace(hypotheses=[h[:limit] for h in r.hypotheses]) for r, limit in zip(results, limits)]
        over = [i for i, r in enumerate(results) if any(len(h) >= limits[i] for h in r.hypotheses)]
        for limit in sorted({limits[i] for i in over}):
            group = [i for i in over if limits[i] == limit]
            for i, result in zip(group, search(group, limit)):
                results[i] = result
        return results
