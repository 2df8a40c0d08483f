"""`Translator`: the one public way to use a trained model from Python.

    from annotated_transformer import Translator
    tr = Translator.from_checkpoint("runs/base/best.pt")
    tr.translate(["Ein Mann fährt Fahrrad."], beam_size=5)

Sentences are encoded with the run's own TextPipeline (saved in the checkpoint), sorted by
length so each batch holds sentences of similar length, decoded with the cached batched
greedy search or beam search, and returned in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from .checkpoint import load_checkpoint
from .config import Config, config_from_dict
from .device import amp_context, configure_backends, native_bf16, select_device
from .errors import CheckpointError
from .model import EncoderDecoder, make_model_from_config


def translate_ids(model: EncoderDecoder, sources: Sequence[Sequence[int]], *, pad: int, bos: int, eos: int,
                  device: torch.device, beam_size: int = 1, alpha: float = 0.6, max_len_a: int = 50,
                  batch_size: int = 128, amp_dtype: torch.dtype | None = None) -> list[list[int]]:
    """Decode id sequences (each <s> ... </s>) in length-sorted batches; return output ids in input order.

    Each output starts after <s> and stops before </s> (both removed). The longest output of a
    sentence is its source length + `max_len_a` tokens, capped by the positional table.
    """
    from .decoding import decode_batch, strip_special

    was_training = model.training
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    cap = model.max_positions
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        S = max(len(sources[i]) for i in idx)
        src = torch.full((len(idx), S), pad, dtype=torch.long)
        for row, i in enumerate(idx):
            src[row, : len(sources[i])] = torch.as_tensor(sources[i], dtype=torch.long)
        lengths = torch.tensor([len(sources[i]) for i in idx])
        src = src.to(device)
        max_len = (lengths + max_len_a).clamp(max=cap)
        with torch.no_grad(), amp_context(device, amp_dtype):
            out = decode_batch(model, src, (src != pad).unsqueeze(-2), max_len, bos, eos,
                               beam_size=beam_size, alpha=alpha, pad_symbol=pad)
        for row, i in enumerate(out.tolist()):
            results[idx[row]] = strip_special(i, bos, eos, pad)
    model.train(was_training)
    return results


def decode_amp_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 autocast for decoding where it is the fast path (CUDA with native bf16); exact fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" and native_bf16(device) else None


class Translator:
    """A trained model with its vocabulary and decoding settings, ready to translate text."""

    def __init__(self, model: EncoderDecoder, text, config: Config, device: torch.device | str = "cpu") -> None:
        self.model = model.eval()
        self.text = text
        self.config = config
        self.to(device)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device | None = None) -> Translator:
        """Load a checkpoint written by training (or by averaging); `device=None` picks cuda/mps/cpu.

        The device is chosen and checked by `select_device`, as training's is.
        """
        dev = select_device("auto" if device is None else str(device), option="device")
        payload = load_checkpoint(path)
        if payload.get("text") is None:
            raise CheckpointError(f"{path} holds a model without a text vocabulary (the copy task?); "
                                  "only translation checkpoints can translate text")
        from .data.text import TextPipeline

        cfg = config_from_dict(payload["config"])
        text = TextPipeline.from_state_dict(payload["text"])
        model = make_model_from_config(cfg.model, len(text.src_vocab), len(text.tgt_vocab))
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise CheckpointError(f"{path}: the weights do not fit the saved config ({first[:160]})") from None
        return cls(model, text, cfg, dev)  # __init__ moves it to dev

    def encode(self, sentence: str) -> tuple[list[int], bool]:
        """Source ids (<s> ... </s>) and whether the sentence had to be truncated to fit data.max_len."""
        ids = self.text.encode(sentence, "src")
        truncated = len(self.text.tokenize(sentence, "src")) + 2 > len(ids)
        return ids, truncated

    def translate(self, sentences: Sequence[str], beam_size: int | None = None, alpha: float | None = None,
                  batch_size: int | None = None) -> list[str]:
        """Translate sentences; returns one string per input, in input order ('' for an empty input)."""
        dec = self.config.decode
        keep = [i for i, s in enumerate(sentences) if s.strip()]
        sources = [self.text.encode(sentences[i], "src") for i in keep]
        outputs = translate_ids(
            self.model, sources, pad=self.text.pad_id, bos=self.text.bos_id, eos=self.text.eos_id,
            device=self.device, beam_size=beam_size or dec.beam_size, alpha=dec.alpha if alpha is None else alpha,
            max_len_a=dec.max_len_a, batch_size=batch_size or dec.batch_size, amp_dtype=self.amp_dtype,
        )
        result = [""] * len(sentences)
        for i, ids in zip(keep, outputs):
            result[i] = self.text.decode(ids, "tgt")
        return result

    def to(self, device: str | torch.device) -> Translator:
        """Move the model to `device`, with the decoding precision and kernel choices that suit it."""
        self.device = torch.device(device)
        self.amp_dtype = decode_amp_dtype(self.device)
        configure_backends(self.device)
        self.model.to(self.device)
        return self

