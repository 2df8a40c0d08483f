"""`Translator`: the one public way to use a trained model from Python.

    from annotated_transformer import Translator
    tr = Translator.load("runs/base", beam=5)          # what a command's --checkpoint takes
    tr.translate("Ein Mann fährt Fahrrad.")             # a str gives a str
    tr.translate(["Ein Mann.", "Eine Frau."])           # a list (or tuple) of str gives a list
    tr.translate("Ein Mann.", beam=5, n_best=3)         # the 3 best translations: Hypothesis(text, score, tokens)
    tr.attention("Ein Mann.")                           # every attention map of the translation (SentenceAttention)

Sentences are encoded with the run's own TextPipeline (saved with the weights), sorted by
length so each batch holds sentences of similar length, decoded with the cached batched
greedy search or beam search (`inference.translate_ids`), and returned in input order.

What a command's --checkpoint names is resolved here too (`resolve_checkpoint`): a run directory,
a model file (NAME.safetensors; or an older version's .pt file or .safetensors/.json pair) gives this
Translator, an exported folder `CT2Translator` (`load_translator`, and `Translator.load`, which hands
out either).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import Config, config_from_dict
from ..decode.inference import translate_ids
from ..runtime.device import configure_backends, keep_freed_memory, native_bf16, select_device
from ..runtime.errors import CheckpointError, ConfigError, DataError, excerpt
from ..checkpoints import load_checkpoint, model_file
from ..harness.run_dir import RunDir, final_record, read_metrics
from ..extensions.builder import build_model
from ..extensions.local_attention import LocalAttentionModel
from ..extensions.token_merging import with_token_merging
from ..model import EncoderDecoder
from .attention import SentenceAttention, sentence_attention
from .ct2_translator import CT2Translator
from .text_translator import TextTranslator, checked_alpha, checked_count


def decode_amp_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast for decoding where it is the fast path (CUDA with native bf16); exact fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" and native_bf16(device) else None


def set_token_reduction(translator: Any, merge_ratio: float | None, prune_ratio: float | None) -> None:
    """--merge-ratio / --prune-ratio on a loaded translator (None: as trained), or one ConfigError saying why not."""
    if merge_ratio is None and prune_ratio is None:
        return
    for option, ratio in (("--merge-ratio", merge_ratio), ("--prune-ratio", prune_ratio)):
        if ratio is not None and not 0.0 <= ratio <= 0.5:
            raise ConfigError(f"{option} must be in [0, 0.5], got {ratio}")
    if merge_ratio and prune_ratio:
        raise ConfigError("--merge-ratio and --prune-ratio: use one of them")
    model = getattr(translator, "model", None)
    if not isinstance(model, EncoderDecoder):
        raise ConfigError("--merge-ratio and --prune-ratio need the PyTorch model (a run directory or a model file); "
                          "an exported folder has neither")
    if isinstance(model, LocalAttentionModel):
        raise ConfigError("--merge-ratio/--prune-ratio: this model was trained with local_attention.window, which "
                          "fewer tokens cannot keep")
    trained = translator.config.token_merging  # its layers and proportional attention, as trained
    translator.model = with_token_merging(model, merge_ratio or 0.0, prune_ratio or 0.0, tuple(trained.layers),
                                          trained.proportional_attention)


def run_weights(run: RunDir) -> tuple[Path, ...]:
    """The files that stand for a run's weights when its final scores name none, in order of preference: its best
    model file (or the best.pt of a run begun by an older version), last.pt (a run stopped before its end)."""
    return model_file(run.best), run.last


def chosen_weights(run: RunDir) -> Path:
    """The checkpoint a run directory stands for: the one its final scores used (best or avg), else the first of
    `run_weights` that exists."""
    if run.metrics.is_file():
        final = final_record(read_metrics(run.metrics))  # the run's end, not an earlier one of a run continued since
        chosen = model_file(run.path / final["checkpoint_file"]) if final and final.get("checkpoint_file") else None
        if chosen is not None and chosen.is_file():
            return chosen
    for path in run_weights(run):
        if path.is_file():
            return path
    raise CheckpointError(f"{run.path} holds no checkpoint yet (no {run.best.name} or {run.last.name}): train it "
                          "first, or pass a model file")


def resolve_checkpoint(path: str | Path) -> tuple[str, Path]:
    """What a --checkpoint names: ('ctranslate2', folder) for a folder written by the export command, else
    ('torch', file) for a model file (its .safetensors), a .pt file or a run directory (`chosen_weights`)."""
    given = Path(path).expanduser()
    if given.is_dir():
        if (given / "model.bin").exists():
            return "ctranslate2", given
        run = RunDir(given)
        if run.metrics.is_file() or any(p.is_file() for p in run_weights(run)):
            return "torch", chosen_weights(run)
        raise CheckpointError(f"{given} is neither a run directory ({run.best.name}, {run.last.name}) nor a model "
                              "folder written by the export command (model.bin); pass one of those or a model file")
    if given.name == "model.bin" and given.is_file():
        return "ctranslate2", given.parent
    return "torch", model_file(given)  # a missing file is load_checkpoint's one line


def torch_checkpoint(given: str | Path, command: str) -> Path:
    """The model file or .pt file a --checkpoint names, for a command that needs the PyTorch model itself."""
    engine, path = resolve_checkpoint(given)
    if engine != "torch":
        raise ConfigError(f"{given} is an exported model folder; {command} needs the run directory or model file "
                          "it was exported from")
    return path


def load_translator(checkpoint: str | Path, engine: str | None = None, device: str | None = None,
                    quantize: str = "none"):
    """The translator a --checkpoint names: `Translator` (optionally int8 or bf16) on a model file or run directory, or
    `CT2Translator` on an exported folder; `engine`, when given, must agree. A wrong combination is one line."""
    if quantize not in ("none", "int8", "bf16"):
        raise ConfigError(f"quantize (--quantize) must be none, int8 or bf16, got {quantize!r}")
    found, path = resolve_checkpoint(checkpoint)
    if engine is not None and not Path(checkpoint).expanduser().exists():
        found = engine  # nothing there to contradict it: the engine's loader names what is missing
    if engine is not None and engine != found:
        what = "an exported model folder" if found == "ctranslate2" else "a PyTorch checkpoint"
        raise ConfigError(f"--engine {engine}, but {checkpoint} is {what}; drop --engine (it follows from "
                          "--checkpoint)" + (" or export it first with the export command" if found == "torch" else ""))
    if found == "ctranslate2":
        if quantize != "none":
            raise ConfigError(f"--quantize {quantize} is for PyTorch checkpoints; an exported model is quantised "
                              f"when exported (export --quantize {quantize}), and decodes with the weights it has")
        return CT2Translator.from_dir(path, device=device or "cpu")  # which checks the device
    translator = Translator.from_checkpoint(path, device=device)
    if quantize == "int8":
        translator.quantize_int8()
    elif quantize == "bf16":
        translator.to_bf16()
    return translator


class Translator(TextTranslator):
    """A trained model with its vocabulary and decoding settings, ready to translate text."""

    def __init__(self, model: EncoderDecoder, text, config: Config, device: torch.device | str = "cpu") -> None:
        self.model = model.eval().requires_grad_(False)  # inference only: no gradients, weights that stay put
        self.text = text
        self.config = config
        self.checkpoint: Path | None = None  # the file it was loaded from, if any
        self.to(device)

    @classmethod
    def load(cls, path: str | Path, *, beam: int | None = None, alpha: float | None = None,
             device: str | torch.device | None = None, quantize: str = "none") -> Translator | CT2Translator:
        """What a command's --checkpoint takes, ready to translate: a run directory, a model file or an exported folder.

        A run directory stands for the weights its final scores used (`resolve_checkpoint`); an exported
        folder gives a `CT2Translator`, with the same `translate`. `beam` and `alpha` replace the
        checkpoint's decode.beam_size and decode.alpha (None keeps them); `device=None` picks
        cuda/mps/cpu (CTranslate2: cpu); `quantize` is "none", "int8" or "bf16", as the commands' --quantize.
        A path or setting that cannot work is one UserError line, the commands' own.
        """
        beam = None if beam is None else checked_count("beam", beam)
        alpha = None if alpha is None else checked_alpha(alpha)
        translator = load_translator(path, device=None if device is None else str(device), quantize=quantize)
        if beam is not None:
            translator.config.decode.beam_size = beam
        if alpha is not None:
            translator.config.decode.alpha = alpha
        return translator

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device | None = None) -> Translator:
        """Our decoder on a run directory or model file written by training (or averaging), or an older .pt file;
        `device=None` picks cuda/mps/cpu, checked by `select_device` as training's is. `load` takes exported
        folders too. Tied weights are tied again: the model is built from the saved config, which ties them."""
        engine, file = resolve_checkpoint(path)
        if engine != "torch":
            raise ConfigError(f"{path} is an exported model folder: load it with Translator.load (CTranslate2), or "
                              "pass the run directory or model file it was exported from")
        dev = select_device("auto" if device is None else str(device), option="device")
        payload = load_checkpoint(file)
        if payload.get("text") is None:
            raise CheckpointError(f"{file} holds a model without a text vocabulary (the copy task?); "
                                  "only translation checkpoints can translate text")
        from ..data.text import TextPipeline

        cfg = config_from_dict(payload["config"])
        text = TextPipeline.from_state_dict(payload["text"])
        model = build_model(cfg, len(text.src_vocab), len(text.tgt_vocab))
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            raise CheckpointError(f"{file}: the weights do not fit the saved config ({excerpt(exc)})") from None
        translator = cls(model, text, cfg, dev)  # __init__ moves it to dev
        translator.checkpoint = file
        return translator

    def translate_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int) -> list[list[int]]:
        """Our batched greedy or beam search on source ids; output ids without <s> and </s>."""
        return self._search(sources, beam_size, alpha, batch_size)

    def n_best_ids(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int,
                   n_best: int) -> list[list[tuple[list[int], float]]]:
        """Our search's `n_best` hypotheses of each source, best first, with their scores (`decode_n_best`)."""
        return self._search(sources, beam_size, alpha, batch_size, n_best)

    def attention(self, sentence: str, *, beam: int | None = None, alpha: float | None = None) -> SentenceAttention:
        """The model's attention on one sentence and the translation it makes: source and target tokens, and every
        map of every layer and head (encoder self-, decoder self- and encoder-decoder attention).

        The sentence is translated as `translate` does (beam and alpha: the same options), then the
        model reads the source and <s> + its translation once more, teacher-forced, keeping every map:
        `.attention["encoder"]`, `["self"]` and `["src"]` are lists of one (heads, queries, keys)
        tensor a layer, whose rows sum to 1, labelled by `.src_tokens` and `.tgt_tokens`. A sentence
        longer than the model's limit is cut (`.truncated`), with a TruncationWarning.
        `visualization.sentence_grid` draws them.
        """
        if not isinstance(sentence, str):
            raise TypeError(f"attention() takes one sentence, a str, got {type(sentence).__name__}")
        if not sentence.strip():
            raise DataError("the sentence is empty; give the source-language text to translate")
        beam, alpha, _ = self.decode_settings(beam, alpha)
        [src_ids], [truncated] = self.encode([sentence], stacklevel=2)
        [out_ids] = self.translate_ids([src_ids], beam, alpha, 1)
        return sentence_attention(self.model, self.text, sentence, src_ids, out_ids, truncated)

    def _search(self, sources: list[list[int]], beam_size: int, alpha: float, batch_size: int,
                n_best: int | None = None) -> list:
        """`decode.translate_ids` with this translator's model, vocabulary, device and settings."""
        text, dec = self.text, self.config.decode
        return translate_ids(self.model, sources, pad=text.pad_id, bos=text.bos_id, eos=text.eos_id, device=self.device,
                             beam_size=beam_size, alpha=alpha, max_len_a=dec.max_len_a, batch_size=batch_size,
                             amp_dtype=self.amp_dtype, attention_kernel=self.config.model.attention_kernel,
                             fast=self.config.train.fast, n_best=n_best)

    def quantize_int8(self) -> Translator:
        """PyTorch's dynamic int8 quantisation of every nn.Linear (int8 weights, activations quantised per call).

        CPU only. Its speed and BLEU against fp32 are measured by scripts/benchmark.py --engines
        (docs/deployment.md). PyTorch has announced the deprecation of its quantised
        tensor types, so this may go with a future PyTorch.
        """
        import warnings

        from torch.ao.quantization import quantize_dynamic

        if self.device.type != "cpu":
            raise ConfigError(f"--quantize int8 runs on the CPU only; drop it or use --device cpu (got {self.device})")
        with warnings.catch_warnings():  # the deprecation notice above, printed on every quantised layer
            warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated", category=UserWarning)
            self.model = quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8)
        self.amp_dtype = None  # int8 kernels compute in fp32 around the int8 matmuls
        return self

    def to_bf16(self) -> Translator:
        """bf16 weights and bf16 arithmetic, without autocast, where the hardware has native bf16.

        Half the bytes of fp32 weights read at every decoding step, and no cast of every weight at
        every step, which autocast does when no gradient is kept (it caches casts only for weights
        that train). Layer norms and softmaxes accumulate in fp32 inside PyTorch's bf16 kernels, and
        beam search ranks in fp32. Its speed and BLEU against fp32 are measured by
        scripts/benchmark.py --engines (docs/performance.md).
        """
        if not native_bf16(self.device):
            raise ConfigError(f"--quantize bf16 needs native bf16 (a CPU with AVX512-BF16 or AMX, or an Ampere or "
                              f"later GPU); this {self.device.type} has none: drop it (fp32 is exact)")
        self.model.to(torch.bfloat16)
        self.amp_dtype = None  # every tensor is bf16 already
        return self

    def to(self, device: str | torch.device) -> Translator:
        """Move the model to `device`, with the decoding precision and kernel choices that suit it."""
        self.device = torch.device(device)
        self.amp_dtype = decode_amp_dtype(self.device)
        configure_backends(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # decoding's large tensors come and go every step
        self.model.to(self.device)
        return self

