"""The fast path's training cost over batch sizes and sentence lengths (scripts/benchmark.py --sweep):
synthetic batches of B sentences of one length, so the cost of length alone shows."""

from __future__ import annotations

import statistics
import time

import torch

from ..config import Config
from ..data.batch import Batch
from ..runtime.device import select_device, synchronize
from ..loop import Log, train_step
from ..extensions.builder import build_training
from ..harness.schedules import build_scheduler


def shape_sweep(cfg: Config, batch_tokens: list[int], lengths: list[int], steps: int, log: Log = print) -> list[dict]:
    """Fast-path training cost over batch sizes (real bucketed batches) and sentence lengths (synthetic): the
    parts training builds (`build_training`, the speed plan on as train.fast says), the model uncompiled."""
    device = select_device(cfg.train.device)
    V = 8000
    torch.manual_seed(cfg.train.seed)
    p = build_training(cfg, V, V, 2, device)
    scheduler = build_scheduler(p.optimizer, cfg.model.d_model, cfg.train.lr_factor, cfg.train.warmup)
    rows = []
    for tokens in batch_tokens:
        for length in lengths:
            B = max(1, tokens // length)
            g = torch.Generator().manual_seed(0)
            src = torch.randint(4, V, (B, length), generator=g)
            tgt = torch.randint(4, V, (B, length + 1), generator=g)
            batch = Batch(src, tgt, pad=2)
            times = []
            for i in range(steps + 1):
                synchronize(device)
                t0 = time.perf_counter()
                train_step([batch.to(device)], p.model, p.loss_compute, p.optimizer, scheduler, amp_dtype=p.amp_dtype,
                           objective=p.objective, step=i)
                synchronize(device)
                if i:
                    times.append(time.perf_counter() - t0)
            dt = statistics.median(times)
            row = {"batch_tokens": tokens, "sentence_length": length, "sentences": B,
                   "tokens_per_s": B * length / dt, "step_ms": 1000 * dt}
            rows.append(row)
            if log:
                log(f"  sweep: {tokens:6d} tokens/batch, length {length:3d} ({B:4d} sentences): "
                    f"{row['tokens_per_s']:9.0f} tok/s, {row['step_ms']:8.1f} ms/step")
    return rows


def shape_chart(rows: list[dict], title: str):
    """Tokens/s against sentence length, one line per batch size (an altair chart)."""
    import altair as alt

    return alt.Chart(alt.Data(values=rows)).mark_line(point=True).encode(
        x=alt.X("sentence_length:Q", title="sentence length (tokens)", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("tokens_per_s:Q", title="training tokens / s"),
        color=alt.Color("batch_tokens:N", title="tokens per batch"),
        tooltip=["batch_tokens:Q", "sentence_length:Q", "sentences:Q", "tokens_per_s:Q", "step_ms:Q"],
    ).properties(title=title, width=420, height=280)
