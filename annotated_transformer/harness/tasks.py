"""What is being learned: the synthetic copy task or translation (Multi30k or your own files), behind one
small interface.

`train_worker` asks a task for its vocabulary sizes, its training loader and validation
batches, and how to score a model (exact copies, or BLEU on a split). Everything else in
the training loop is the same for both. `TaskFiles` holds the files a translation run reads,
opened once for the resume's check and the data load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config import Config
from ..data.batch import Batch
from ..data.copy_loader import CopyLoader, copy_validation_batches
from ..data.copy_task import COPY_PAD, COPY_START
from ..data.loader import static_shapes_on
from ..decode.incremental import greedy_search
from ..extensions.builder import build_resegmentation
from ..decode.inference import translate_ids
from ..decode.static import Step
from ..masks import padding_mask
from .distributed import DistInfo


@dataclass
class CopyTask:
    """The notebook's copy task: random sequences that the model learns to repeat."""

    cfg: Config
    info: DistInfo
    text: Any = None  # no text vocabulary: ids are the tokens
    name: str = "copy"

    @property
    def src_vocab_size(self) -> int:
        return self.cfg.data.copy_vocab

    @property
    def tgt_vocab_size(self) -> int:
        return self.cfg.data.copy_vocab

    @property
    def pad(self) -> int:
        return COPY_PAD

    def train_loader(self, pin_memory: bool = False) -> CopyLoader:
        """Fresh random batches every epoch, different on every rank."""
        d = self.cfg.data
        return CopyLoader(d.copy_vocab, d.copy_batch_size, d.copy_batches, d.copy_seq_len,
                          self.cfg.train.seed, self.info.rank, self.info.world_size)

    def val_batches(self, static: bool = False) -> list[Batch]:
        """A fixed validation set, split between ranks (one shape already, static or not)."""
        d = self.cfg.data
        full = copy_validation_batches(d.copy_vocab, d.copy_seq_len, self.cfg.train.seed)[0]
        rows = torch.arange(self.info.rank, len(full), self.info.world_size)
        src = full.src[rows]  # (n/world, L); the target is the source itself
        return [Batch(src, src.clone(), pad=COPY_PAD)] if len(rows) else []

    def score(self, model, device: torch.device, split: str = "val", **_: Any) -> dict[str, Any]:
        """Exact copies out of 100 fresh sequences (computed on every rank; identical)."""
        d = self.cfg.data
        k = exact_copies(model, d.copy_vocab, d.copy_seq_len, n=100, device=device)
        return {"exact_copies": k, "copy_accuracy": k / 100}


@torch.no_grad()
def exact_copies(model, V: int, seq_len: int, n: int = 100, seed: int = 1234,
                 device: torch.device | str = "cpu") -> int:
    """Greedy-decode `n` fresh random sequences; return how many come back exactly."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, V, (n, seq_len), generator=g)
    src[:, 0] = COPY_START
    src = src.to(device)
    was_training = model.training
    model.eval()
    try:
        out = greedy_search(model, src, padding_mask(src, COPY_PAD), seq_len, COPY_START)
    finally:
        model.train(was_training)
    return int((out == src).all(dim=1).sum())


@dataclass
class TranslationTask:
    """Translation, data.src_lang -> data.tgt_lang (Multi30k or your own files): tokenised, numericalised, cached;
    scored with sacreBLEU."""

    cfg: Config
    info: DistInfo
    data: Any  # TranslationData
    static: bool | None = None  # the static-shape plan on or off (build_task decides it on the device)
    name: str = "translation"

    @property
    def text(self):
        return self.data.text

    @property
    def src_vocab_size(self) -> int:
        return len(self.data.text.src_vocab)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.data.text.tgt_vocab)

    @property
    def pad(self) -> int:
        return self.data.text.pad_id

    def train_loader(self, pin_memory: bool = False):
        """Length-bucketed (or the notebook's) batches, sharded by rank; resegmented each epoch (subword sampling)."""
        return self.data.train_loader(self.cfg.train.seed, self.info.rank, self.info.world_size, pin_memory=pin_memory,
                                      resegment=build_resegmentation(self.cfg, self.data),
                                      plan_on_served=lengths_vary(self.cfg), static=self.static)

    def val_batches(self, static: bool = False) -> list[Batch]:
        """Teacher-forced validation batches of this rank's share of the val split (`static`: of fixed shapes)."""
        return self.data.eval_batches("val", self.info.rank, self.info.world_size, static)

    def translate_split(self, model, device: torch.device, split: str, beam_size: int = 1,
                        amp_dtype: torch.dtype | None = None, limit: int | None = None,
                        static: Step | None = None) -> list[str]:
        """Every rank decodes its share of `split`; all ranks get the full list of hypotheses in order (`static`: greedy
        search on fixed shapes with that decoder step)."""
        sp = self.data.splits[split]
        n = len(sp.src) if limit is None else min(limit, len(sp.src))
        mine = list(range(self.info.rank, n, self.info.world_size))
        dec, text = self.cfg.decode, self.data.text
        outs = translate_ids(model, [sp.src[i] for i in mine], pad=text.pad_id, bos=text.bos_id,
                             eos=text.eos_id, device=device, beam_size=beam_size, alpha=dec.alpha,
                             max_len_a=dec.max_len_a, batch_size=dec.batch_size, amp_dtype=amp_dtype,
                             static=static, attention_kernel=self.cfg.model.attention_kernel, fast=self.cfg.train.fast)
        local = [(i, text.ids_to_text(ids, "tgt")) for i, ids in zip(mine, outs)]
        if self.info.distributed and dist.is_initialized():
            gathered: list[Any] = [None] * self.info.world_size
            dist.all_gather_object(gathered, local)
            local = [pair for part in gathered for pair in part]
        hyps = [""] * n
        for i, h in local:
            hyps[i] = h
        return hyps

    def score(self, model, device: torch.device, split: str = "val", beam_size: int = 1,
              amp_dtype: torch.dtype | None = None, limit: int | None = None,
              static: Step | None = None) -> dict[str, Any]:
        """BLEU (headline form for the tokenisation mode), its signature, chrF; plus the hypotheses."""
        from ..scoring import score_translations

        hyps = self.translate_split(model, device, split, beam_size, amp_dtype, limit, static)
        sp = self.data.splits[split]
        raw = sp.tgt_text[:limit] if limit else sp.tgt_text
        head, scores = score_translations(hyps, raw, self.data.text, sp.tgt_refs)
        out: dict[str, Any] = {"bleu": head.score, "bleu_signature": head.signature, "hypotheses": hyps}
        for key, s in scores.items():
            out[f"score_{key}"] = s.score
        return out


def lengths_vary(cfg: Config) -> bool:
    """Whether a resegmentation that is on (subword sampling) serves new lengths every epoch: batches are then
    filled by the lengths served, and data.static_shapes=auto stays off."""
    return any(extension.changes_lengths for extension in cfg.extensions_on("resegmentation"))


def static_shapes_for(cfg: Config, cuda: bool) -> bool:
    """Whether training takes the static-shape plan: data.static_shapes, where 'auto' means on a CUDA GPU (`cuda`)
    unless a resegmentation serves new lengths every epoch."""
    return static_shapes_on(cfg.data.static_shapes, cuda=cuda, lengths_vary=lengths_vary(cfg))


def build_task(cfg: Config, info: DistInfo, log: Callable[[str], None] | None = print, cuda: bool = False,
               corpus: Any = None):
    """The task the config names, with its data prepared (downloaded, tokenised, cached); `cuda`: training on a CUDA
    GPU, where data.static_shapes=auto takes the static-shape plan (the data's line counts the batches served);
    `corpus`: the config's corpus already opened (`TaskFiles.corpus`), whose files' checks are not made again."""
    if cfg.data.dataset == "copy":
        return CopyTask(cfg, info)
    from ..data import load_translation_data

    static = static_shapes_for(cfg, cuda)
    data = load_translation_data(cfg, rank=info.rank, world_size=info.world_size, log=log, static=static,
                                 corpus=corpus)
    return TranslationTask(cfg, info, data, static)


@dataclass
class TaskFiles:
    """The files a run's task reads, opened once: found before the run's folder is taken (`locate`), checked for a
    resume to compare (`fingerprint`), then loaded (`build_task(corpus=)`): every file is checked and hashed once."""

    cfg: Config
    log: Callable[[str], None] | None = None  # where a download of Multi30k says so (rank 0's print)
    corpus: Any = None  # the Multi30k or OwnFiles of the config, once opened (None: not yet, or the copy task)
    task: Any = None  # the task, once built (`build`)

    def build(self, info: DistInfo, cuda: bool, log: Callable[[str], None] | None) -> Any:
        """The config's task (`build_task` on the corpus opened here), built once: the data built before
        train.overwrite clears a run is the data the run trains on (its data line logged then, once)."""
        if self.task is None:
            self.task = build_task(self.cfg, info, log=log, cuda=cuda, corpus=self.corpus)
        return self.task

    def locate(self) -> None:
        """Find the corpus before a run's folder is made: your own files (data.dataset=files; a DataError names
        one that is missing; nothing read yet), or Multi30k's six files in data.root, $MULTI30K_DIR or the cache
        (downloaded there when missing, checked by their checksums: a wrong data.root, or no network, is one line
        with nothing written). The copy task has no files."""
        if self.corpus is not None or self.cfg.data.dataset == "copy":
            return
        from ..data.translation_data import open_corpus

        self.corpus = open_corpus(self.cfg.data, log=self.log)

    def fingerprint(self) -> dict[str, Any]:
        """The data fingerprint of today's files (`data_fingerprint`), what a resume compares with its last.pt."""
        from ..data.translation_data import data_fingerprint, open_corpus

        if self.corpus is None:
            self.corpus = open_corpus(self.cfg.data, log=self.log)
        return data_fingerprint(self.cfg.data, self.corpus, seed=self.cfg.train.seed)

    @property
    def resume_check(self) -> Callable[[], dict[str, Any]] | None:
        """What RunDir.open calls for the fingerprint to compare at a resume (None: the copy task has no files)."""
        return None if self.cfg.data.dataset == "copy" else self.fingerprint
