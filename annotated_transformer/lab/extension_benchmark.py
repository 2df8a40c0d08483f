"""What the extensions cost: training tokens/s, encoding and greedy decoding sentences/s of each switch against
the plain model, in one process, on the same batches, in interleaved rounds (scripts/benchmark.py
--extensions).

Each arm is the config plus its overrides (`ARMS`: "plain", then the arms each extension registers),
built with the same seed. A round times `steps` optimizer steps of every arm on the same list of real
training batches, encoding of the first validation sentences, then greedy decoding of them run to a
fixed length (no end symbol, so every arm decodes the same number of positions: the figure is the
cost per position, not a quality). The result per arm is the median over rounds and its ratio to
the plain arm's median; each round starts with the next arm, so no arm always runs first (a machine
that slows down in the middle slows every arm alike).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..config import EXTENSIONS, Config, Extension, apply_override, config_from_dict, config_to_dict
from ..data.buckets import pad_rows
from ..decode.incremental import greedy_search
from ..runtime.device import select_device
from ..runtime.precision import amp_context
from ..runtime.errors import ConfigError
from ..extensions.builder import build_training
from ..loop import Log, train_step
from ..masks import padding_mask
from ..harness.schedules import build_scheduler


def benchmark_arms(extensions: Sequence[Extension]) -> dict[str, tuple[str, ...]]:
    """Every arm and its overrides: "plain", each extension's arms (its registration's) in the extensions' order,
    then the core settings measured beside them."""
    arms: dict[str, tuple[str, ...]] = {"plain": ()}
    for extension in extensions:
        arms.update(extension.arms)
    return {**arms, "no attention dropout": ("model.attention_dropout=0.0",)}


# The settings measured in docs/extensions.md's table, each against "plain".
ARMS = benchmark_arms(EXTENSIONS)


def select_arms(names: list[str] | None) -> dict[str, tuple[str, ...]]:
    """--arms: the named ARMS (None: all), always after "plain", which every ratio is measured against."""
    if not names:
        return dict(ARMS)
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise ConfigError(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    return {n: ARMS[n] for n in ["plain", *[n for n in names if n != "plain"]]}


class _Arm:
    """One setting's model, optimizer and objective, ready to time."""

    def __init__(self, cfg: Config, vocab: tuple[int, int], pad: int, device: torch.device) -> None:
        torch.manual_seed(cfg.train.seed)
        # the eager model: the extensions' cost, not the compiler's; the weight average's optimizer hook is timed
        self.model, self.loss_compute, self.objective, self.optimizer, self.amp_dtype, _, self.ema = build_training(
            cfg, *vocab, pad, device)
        self.scheduler = build_scheduler(self.optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup)
        self.step = 0

    def train(self, batches: list[Any]) -> float:
        """Seconds for one optimizer step per batch."""
        self.model.train()
        t0 = time.perf_counter()
        for batch in batches:
            loss, _ = train_step([batch], self.model, self.loss_compute, self.optimizer, self.scheduler,
                                 amp_dtype=self.amp_dtype, objective=self.objective, step=self.step)
            self.step += 1
        loss.item()  # wait for the last step
        return time.perf_counter() - t0

    @torch.no_grad()
    def encode(self, src: torch.Tensor, pad: int) -> float:
        """Seconds to encode `src` (the memory the decoder reads, merged where merging is on)."""
        self.model.eval()
        t0 = time.perf_counter()
        with amp_context(src.device, self.amp_dtype):
            memory, _ = self.model.encode_memory(src, padding_mask(src, pad))
        memory.sum().item()
        return time.perf_counter() - t0

    @torch.no_grad()
    def decode(self, src: torch.Tensor, pad: int, bos: int, length: int) -> float:
        """Seconds to decode `src` greedily to `length` positions (no end symbol)."""
        self.model.eval()
        t0 = time.perf_counter()
        with amp_context(src.device, self.amp_dtype):
            greedy_search(self.model, src, padding_mask(src, pad), length, bos, None, pad)
        return time.perf_counter() - t0


def measure_extensions(cfg: Config, arms: dict[str, tuple[str, ...]] = ARMS, steps: int = 20, rounds: int = 5,
                       sentences: int = 256, length: int = 20, log: Log = print) -> dict[str, Any]:
    """Median training tokens/s and decoding sentences/s per arm over `rounds`, and ratios to the first arm."""
    if cfg.data.dataset != "multi30k":
        raise ConfigError(f"--extensions times training on Multi30k; {cfg.name} has data.dataset={cfg.data.dataset}")
    if steps < 1 or rounds < 1:
        raise ConfigError(f"--steps and --rounds must be at least 1 (got {steps}, {rounds})")
    from ..data import load_translation_data

    device = select_device(cfg.train.device)
    data = load_translation_data(cfg, log=None)
    pad, bos, vocab = data.text.pad_id, data.text.bos_id, (len(data.text.src_vocab), len(data.text.tgt_vocab))
    loader = iter(data.train_loader(cfg.train.seed))
    batches = [next(loader).to(device) for _ in range(steps)]
    tokens = sum(b.ntokens for b in batches)
    val = data.splits["val"].src[:sentences]
    src = pad_rows(val, pad).to(device)  # (n, S)
    built = {}
    for name, overrides in arms.items():
        arm_cfg = config_from_dict(config_to_dict(cfg))
        for override in overrides:
            apply_override(arm_cfg, override)
        built[name] = _Arm(arm_cfg.validate(), vocab, pad, device)
        built[name].train(batches[:2])  # warm-up: first-call allocations and kernel choices
        built[name].encode(src, pad)
        built[name].decode(src[:8], pad, bos, length)
    train_s: dict[str, list[float]] = {name: [] for name in arms}
    decode_s: dict[str, list[float]] = {name: [] for name in arms}
    encode_s: dict[str, list[float]] = {name: [] for name in arms}
    names = list(built)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts with the next arm
            arm = built[name]
            train_s[name].append(arm.train(batches))
            encode_s[name].append(arm.encode(src, pad))
            decode_s[name].append(arm.decode(src, pad, bos, length))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {tokens / train_s[n][-1]:.0f} tok/s" for n in arms))
    first = next(iter(arms))
    rows = {}
    for name in arms:
        tok_s = tokens / statistics.median(train_s[name])
        sent_s = len(val) / statistics.median(decode_s[name])
        rows[name] = {"overrides": list(arms[name]), "train_tokens_per_s": tok_s, "decode_sentences_per_s": sent_s,
                      "encode_sentences_per_s": len(val) / statistics.median(encode_s[name])}
    for row in rows.values():
        for key in ("train_tokens_per_s", "encode_sentences_per_s", "decode_sentences_per_s"):
            row[key.split("_")[0] + "_ratio"] = row[key] / rows[first][key]
    return {"config": cfg.name, "device": str(device), "threads": torch.get_num_threads(), "steps": steps,
            "rounds": rounds, "tokens_per_round": tokens, "sentences": len(val), "decode_length": length,
            "arms": rows}


def format_extensions(result: dict[str, Any]) -> str:
    """The table scripts/benchmark.py --extensions prints."""
    lines = [f"{result['config']} on {result['device']} ({result['threads']} threads): median of {result['rounds']} "
             f"rounds of {result['steps']} training steps and {result['sentences']} sentences decoded to "
             f"{result['decode_length']} positions",
             f"{'arm':24s} {'train tok/s':>12s} {'ratio':>6s} {'encode sent/s':>14s} {'ratio':>6s} "
             f"{'decode sent/s':>14s} {'ratio':>6s}"]
    for name, row in result["arms"].items():
        lines.append(f"{name:24s} {row['train_tokens_per_s']:12.0f} {row['train_ratio']:6.2f} "
                     f"{row['encode_sentences_per_s']:14.0f} {row['encode_ratio']:6.2f} "
                     f"{row['decode_sentences_per_s']:14.1f} {row['decode_ratio']:6.2f}")
    return "\n".join(lines)
