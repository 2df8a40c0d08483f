"""The config below the extensions: `param` (a field with its help text), the core sections (`model`, `data`,
`train`, `decode`), `CoreConfig` (a run without extensions, and the rules) and `Extension` (what an extension
module registers: its own section, rules and installation).

The data pipeline and every extension module import this module; config/schema.py, above them, builds the whole
`Config` from `CoreConfig` and the extensions' registrations. Invalid combinations raise `ConfigError` with a
one-line message; scripts turn that into `error: ...` on stderr and exit 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from .runtime.errors import ConfigError
from .runtime.files import USER_CACHE


def param(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with a help text and optional allowed values."""
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    """The Transformer's shape (the paper's symbols: N, d_model, d_ff, h)."""

    N: int = param(6, "number of encoder layers and of decoder layers (the paper's N)")
    N_dec: int = param(0, "decoder layers when they should differ from N (0: N); a deep encoder with a shallow "
                       "decoder trains and decodes faster")
    d_model: int = param(512, "width of embeddings and of every sublayer's output (d_model)")
    d_ff: int = param(2048, "inner width of the position-wise feed-forward network (d_ff)")
    h: int = param(8, "number of attention heads (h); d_model must be divisible by h")
    dropout: float = param(0.1, "dropout on sublayer outputs and embeddings+positions (the paper's P_drop), and on "
                           "attention weights and feed-forward activations unless set apart below")
    attention_dropout: float | None = param(None, "dropout on the attention probabilities when it should differ "
                                            "from model.dropout (null: model.dropout)")
    activation_dropout: float | None = param(None, "dropout after the feed-forward network's ReLU when it should "
                                             "differ from model.dropout (null: model.dropout)")
    norm_first: bool = param(
        True, "true: pre-norm x + Sublayer(LayerNorm(x)) as the notebook; false: post-norm as the paper"
    )
    tie_embeddings: bool = param(
        False, "share one matrix between source/target embeddings and the generator (needs a shared vocabulary)"
    )
    attention_kernel: str = param(
        "auto", "how attention is computed: 'fused' (PyTorch's scaled_dot_product_attention, which the speed plan "
        "swaps in), 'explicit' (the notebook's softmax(Q K^T / sqrt(d_k)) V, step by step) or 'auto' (fused on GPUs, "
        "explicit on the CPU, where it is faster); with train.fast=false, explicit",
        choices=("auto", "fused", "explicit"),
    )
    max_positions: int = param(5000, "length of the sinusoidal positional-encoding table")
    layer_norm_eps: float = param(1e-6, "epsilon inside LayerNorm's square root")


@dataclass
class DataConfig:
    """Which data, how it is tokenised, and how it is batched."""

    dataset: str = param("multi30k", "'multi30k' (image captions, de->en or en->de), 'files' (your own parallel text: "
                         "data.train, data.val, data.test) or 'copy' (synthetic copy task)",
                         choices=("multi30k", "files", "copy"))
    root: str | None = param(None, "folder holding the six Multi30k .gz files (else $MULTI30K_DIR, else download)")
    train: str | None = param(None, "data.dataset=files: the training files' path prefix: PREFIX.<src_lang> and "
                              "PREFIX.<tgt_lang>, plain or .gz, one sentence a line (docs/own_data.md)")
    val: str | None = param(None, "data.dataset=files: the validation files' prefix (BLEU, the best model file), "
                            "as data.train")
    test: str | None = param(None, "data.dataset=files: the test files' prefix, as data.train (optional: without it "
                             "the final scores are on val)")
    cache_dir: str = param(USER_CACHE, "where downloads and tokenised caches are kept")
    src_lang: str = param("de", "source language code (Multi30k: 'de' or 'en'; data.dataset=files: its files' "
                          "suffix, e.g. 'fr')")
    tgt_lang: str = param("en", "target language code (the other of 'de' and 'en' for Multi30k)")
    tokenizer: str = param("word", "'word' (spaCy rule-based tokenizer) or 'spm' (joint SentencePiece subwords)",
                           choices=("word", "spm"))
    lowercase: bool = param(False, "lowercase all text before tokenising")
    min_freq: int = param(2, "word mode: a token needs this many training occurrences to enter the vocabulary")
    spm_vocab_size: int = param(8000, "spm mode: size of the joint SentencePiece vocabulary")
    spm_sample: int = param(1_000_000, "spm mode: the most training sentences (both languages counted) SentencePiece "
                            "learns from; a larger training split gives it a random sample of its pairs, drawn with "
                            "train.seed (its peak memory grows with the sentences: about 2.8 GB for a million of 24 "
                            "words); 0: every sentence")
    max_sentence_len: int = param(128, "longest sentence in tokens, <s> and </s> included; longer ones are cut or "
                                  "skipped")
    long_policy: str = param("truncate", "what to do with longer sentences: 'truncate' or 'skip'",
                             choices=("truncate", "skip"))
    batching: str = param("bucket", "'bucket' (length-bucketed, about batch_tokens a batch) or 'notebook' "
                          "(the notebook's: 32 sentences padded to 72)", choices=("bucket", "notebook"))
    batch_tokens: int = param(4096, "bucket mode: about this many padded tokens (source or target) per batch")
    static_shapes: bool | str = param(
        "auto", "bucket mode: true draws every batch from a few fixed (rows, width) shapes, so a GPU compiles or "
        "captures the training step once per shape, and a CPU keeps oneDNN's compiled kernels for a few shapes "
        "instead of hundreds (less memory; validation then decodes on fixed shapes too); about 10% padding "
        "instead of 3%, every sentence still once an epoch; 'auto': true when training on a CUDA GPU without "
        "subword sampling, else false (the plain bucket plan)", choices=("auto", True, False))
    num_workers: int = param(0, "data-loader worker processes (batches are pre-numericalised, so 0 is fine)")
    copy_vocab: int = param(11, "copy task: vocabulary size (token 0 pads, token 1 starts every sequence)")
    copy_seq_len: int = param(10, "copy task: sequence length, start symbol included")
    copy_batch_size: int = param(80, "copy task: sequences per batch")
    copy_batches: int = param(20, "copy task: batches per epoch")


@dataclass
class TrainConfig:
    """The optimisation recipe and the run's bookkeeping."""

    seed: int = param(42, "random seed for weights, dropout, data order")
    epochs: int = param(8, "number of passes over the training data")
    max_steps: int = param(0, "stop after this many optimizer steps (0: no limit)")
    accum_steps: int = param(1, "micro-batches accumulated per optimizer step (the notebook's accum_iter)")
    lr_factor: float = param(1.0, "multiplier of the Noam schedule (the notebook's base_lr / factor)")
    warmup: int = param(4000, "optimizer steps of linear learning-rate warm-up")
    schedule: str = param(
        "noam", "learning-rate schedule: 'noam' (the paper's rate: warm-up, then 1/sqrt(step)), or 'linear' / "
        "'cosine' (warm-up to the same peak, then decay to final_lr_ratio x peak at the run's last step: "
        "train.max_steps, or train.epochs' steps)", choices=("noam", "linear", "cosine"))
    final_lr_ratio: float = param(0.0, "linear/cosine schedules: the rate at the last step, as a fraction of the peak")
    label_smoothing: float = param(0.1, "label smoothing epsilon (the paper's 0.1)")
    adam_betas: list[float] = param([0.9, 0.98], "Adam's (beta1, beta2)")
    adam_eps: float = param(1e-9, "Adam's epsilon")
    clip_grad_norm: float = param(0.0, "clip the gradient's global norm to this (0: no clipping)")
    device: str = param("auto", "'auto' (cuda, else mps, else cpu) or an explicit torch device like 'cuda:1'")
    malloc: str = param("auto", "the C allocator of a training process: 'auto' (on the CPU, tcmalloc where the "
                        "machine has it, else mimalloc from the cmeel-mimalloc package the lock installs on Linux, "
                        "else the system's), 'system', 'tcmalloc' or 'mimalloc' (an error if missing) or, on the "
                        "command line only, a library's path (any device; a config file may not name code to load); "
                        "the train command restarts itself with it preloaded, the benchmark times its training "
                        "steps under it (CPU training ran 1.13-1.24x faster under tcmalloc than glibc's)")
    precision: str = param("auto", "'auto' (bf16 autocast where the GPU or CPU runs bf16 natively, fp32 elsewhere), "
                           "'bf16' or 'fp32'",
                           choices=("auto", "bf16", "fp32"))
    compile: bool | str = param(False, "torch.compile the model: true (one compile serves every batch shape), "
                                "'captured' (also replays each batch shape's forward and backward as CUDA graphs: "
                                "torch.compile's reduce-overhead mode; CUDA GPUs only), or false",
                                choices=(False, True, "captured"))
    fast: bool = param(True, "install the speed plan (fast/plan.py) on the notebook's model, loss and optimizer: "
                       "the cheaper CPU dropout mask, the fused attention kernel (as model.attention_kernel says), "
                       "the loss fused with the log-softmax, fused Adam, torch.compile (train.compile), and while "
                       "validation decodes oneDNN's linears on the CPU; false: the notebook's exact path (nn.Dropout, "
                       "explicit attention, SimpleLossCompute, PyTorch's default Adam, no compile), which true "
                       "matches within float rounding (its dropout mask draws differently)")
    out_dir: str | None = param(None, "run directory (default: runs/<config name>)")
    overwrite: bool = param(False, "replace an existing run directory instead of refusing")
    resume: bool | str = param(
        "auto", "'auto': continue out_dir's run from its last.pt when there is one (a finished run is left as "
        "it is), else start; true: continue it, and fail without last.pt; false: refuse an existing run",
        choices=("auto", True, False))
    keep_last_epochs: int = param(0, "keep only the newest N epoch_NN model files (0: keep them all)")
    val_every_steps: int = param(0, "also validate every N optimizer steps, inside epochs (validation loss, BLEU as "
                                 "train.bleu_every says, the best model file), beside each epoch's end (0: at epoch "
                                 "ends only)")
    save_every_steps: int = param(0, "also write last.pt and a step_NNNNNNN model file every N optimizer steps, "
                                  "inside epochs, beside each epoch's end (0: at epoch ends only); a run killed "
                                  "inside an epoch continues from the newest one")
    keep_last_steps: int = param(5, "keep only the newest N step_NNNNNNN model files (0: keep them all)")
    average_last: int = param(0, "at the end, average the last N saved checkpoints' weights (the step_NNNNNNN files "
                              "with train.save_every_steps, else the epoch_NN files; the paper averaged its last 5) "
                              "into the avg model file and use it for the final scores if it beats best on val "
                              "(0 or 1: off)")
    log_every: int = param(50, "optimizer steps between log lines")
    bleu_every: int = param(1, "validations between validation BLEU evaluations: every N epochs and, with "
                            "train.val_every_steps, every N-th validation inside epochs (0: never)")
    target_bleu: float = param(0.0, "validation BLEU to time: the first epoch and train_seconds reaching it are "
                               "recorded in metrics.jsonl and the final line (0: off)")
    stop_at_target: bool = param(False, "end training at the first epoch whose validation BLEU reaches "
                                 "train.target_bleu (to time a config to a target; with the 'noam' schedule, "
                                 "which needs no run length)")
    best_metric: str = param("bleu", "what picks the best model file: 'bleu' (higher is better) or 'loss' (lower)",
                             choices=("bleu", "loss"))
    progress: bool = param(True, "show a tqdm progress bar on rank 0 (when stderr is a terminal)")
    tensorboard: bool = param(False, "also write the metrics as TensorBoard event files in <run dir>/tensorboard "
                              "(rank 0; needs the tensorboard extra: uv sync --extra tensorboard)")
    final_eval: bool = param(True, "at the end, score val and test with the best model file and show example "
                             "translations")
    score_test: bool = param(True, "final_eval also scores the test split (false while choosing settings on val)")

    def finished(self, epoch: int, step: int, target_reached: bool = False) -> bool:
        """Whether a run that completed `epoch` epochs and `step` optimizer steps (and reached target_bleu or
        not) is done with this recipe."""
        return bool((self.epochs and epoch >= self.epochs) or (self.max_steps and step >= self.max_steps)
                    or (self.stop_at_target and target_reached))

    def epoch_steps(self, batches_per_epoch: int) -> int:
        """The optimizer steps of one epoch (its last group of accum_steps batches may be short)."""
        return -(-batches_per_epoch // self.accum_steps)

    def total_steps(self, batches_per_epoch: int) -> int:
        """The optimizer steps a run takes: max_steps, or the epochs' worth if fewer."""
        by_epochs = self.epochs * self.epoch_steps(batches_per_epoch)
        return min(x for x in (by_epochs, self.max_steps) if x > 0)


@dataclass
class DecodeConfig:
    """How translations are produced."""

    beam_size: int = param(1, "beam width (1: greedy)")
    alpha: float = param(0.6, "length-penalty exponent of Wu et al. (2016) for beam search")
    max_len_a: int = param(50, "longest output: source length + this many tokens")
    batch_size: int = param(128, "sentences decoded together")


def not_negative(values: dict[str, float], note: str = "") -> None:
    """Raise a ConfigError for the first of `values` (dotted key -> value) below 0; `note` follows 'negative'."""
    for key, value in values.items():
        if value < 0:
            raise ConfigError(f"{key} must not be negative{note}, got {value}")


# How an extension is installed (`Extension.kind`), and how builder.py calls its `install` when the config
# switches it on (`cfg` is the whole Config; the extensions of one kind are called in their order).
KINDS = {
    "model": "install(cfg, model) -> the model with the extension: a subclass on the same weights",
    "objective": "install(cfg, model, pad, objective) -> the training step's objective; `objective` is the one the "
                 "objectives before it built (None: the plain step), which one that combines may wrap",
    "resegmentation": "install(cfg, data, resegment) -> epoch -> the training split's (src, tgt) ids; `resegment` is "
                      "the one before it (None: the cached ids)",
    "weight average": "install(cfg, model, optimizer) -> a WeightAverage updated by the optimizer's steps",
}


@dataclass(frozen=True, eq=False)
class Extension:
    """What an extension module registers as its module-level `EXTENSION`: its config section, its rules, how it is
    installed and what the extension benchmark times of it. The module is named after its section."""

    name: str  # the config section's key (cfg.<name>), and the module's name
    section: type  # the section's dataclass: every field a param(...), the extension off by default
    help: str  # the section in a few words
    order: int  # where the section comes after the core ones, and where its install comes among its kind's
    kind: str  # one of KINDS
    on: Callable[[Any], bool]  # whether its section switches it on
    install: Callable[..., Any]  # called as KINDS[kind] says, only when it is on
    validate: Callable[[Any], None] = lambda cfg: None  # its rules, given the whole config: ConfigError
    combines: bool = False  # an objective that may be on with the others that combine (one wraps the one before)
    # a resegmentation whose ids differ in length from the cached ones: the batches are filled by the served lengths
    changes_lengths: bool = False
    arms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # extension benchmark: arm name -> overrides

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"extension {self.name}: kind must be one of {list(KINDS)}, got {self.kind!r}")


C = TypeVar("C", bound="CoreConfig")  # validate() returns the config it checked, of its own class


@dataclass
class CoreConfig:
    """A run without extensions: the core sections and the rules. `Config` (config/schema.py) is this class with one
    section per extension after them; its EXTENSIONS holds their registrations."""

    EXTENSIONS: ClassVar[tuple[Extension, ...]] = ()

    name: str = param("run", "the run's name (defaults to the config file's stem)")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "model shape"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data and batching"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "optimisation and the run"})
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={"help": "decoding"})

    def validate(self: C) -> C:
        """Check rules that involve several fields; raise ConfigError on the first broken one."""
        self._validate_ranges()
        self._validate_training()
        self._validate_data()
        for extension in self.EXTENSIONS:
            extension.validate(self)
        self._validate_objectives()
        return self

    def extensions_on(self, kind: str) -> list[Extension]:
        """The extensions of `kind` this config switches on, in their order."""
        return [ext for ext in self.EXTENSIONS if ext.kind == kind and ext.on(getattr(self, ext.name))]

    def _validate_ranges(self) -> None:
        """Each number in its range, and d_model divisible by h."""
        m, d, t, dec = self.model, self.data, self.train, self.decode
        positive = {
            "model.N": m.N, "model.d_model": m.d_model, "model.d_ff": m.d_ff, "model.h": m.h,
            "model.max_positions": m.max_positions, "data.batch_tokens": d.batch_tokens,
            "data.min_freq": d.min_freq, "data.copy_batch_size": d.copy_batch_size,
            "data.copy_batches": d.copy_batches, "train.accum_steps": t.accum_steps,
            "train.log_every": t.log_every, "train.warmup": t.warmup,
            "decode.beam_size": dec.beam_size, "decode.batch_size": dec.batch_size,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be at least 1, got {value}")
        not_negative({"train.epochs": t.epochs, "train.max_steps": t.max_steps, "train.bleu_every": t.bleu_every,
                      "data.num_workers": d.num_workers, "train.clip_grad_norm": t.clip_grad_norm,
                      "decode.max_len_a": dec.max_len_a, "train.adam_eps": t.adam_eps,
                      "train.keep_last_epochs": t.keep_last_epochs, "train.average_last": t.average_last,
                      "train.val_every_steps": t.val_every_steps, "train.save_every_steps": t.save_every_steps,
                      "train.keep_last_steps": t.keep_last_steps, "data.spm_sample": d.spm_sample})
        if m.d_model % m.h:
            raise ConfigError(
                f"model.d_model ({m.d_model}) must be divisible by model.h ({m.h}); "
                f"pick h from {[k for k in range(1, 17) if m.d_model % k == 0]}"
            )
        rates = {"model.dropout": m.dropout, "model.attention_dropout": m.attention_dropout,
                 "model.activation_dropout": m.activation_dropout}
        for key, rate in rates.items():
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {rate}")
        if not 0.0 <= t.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got {t.label_smoothing}")
        if len(t.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in t.adam_betas):
            raise ConfigError(f"train.adam_betas must be two numbers in [0, 1), got {t.adam_betas}")
        if not 0.0 <= t.final_lr_ratio <= 1.0:
            raise ConfigError(f"train.final_lr_ratio must be in [0, 1], got {t.final_lr_ratio}")
        if m.N_dec < 0:
            raise ConfigError(f"model.N_dec must be 0 (the same as model.N) or positive, got {m.N_dec}")
        if t.target_bleu < 0:
            raise ConfigError(f"train.target_bleu must not be negative, got {t.target_bleu}")
        if not 0 < t.lr_factor < math.inf:  # nan fails both
            raise ConfigError(f"train.lr_factor must be a positive number, got {t.lr_factor}")
        if not 0 < t.adam_eps < math.inf:  # 0 divides by a zero second moment: the first step diverges
            raise ConfigError(f"train.adam_eps must be a positive number (the paper's 1e-9), got {t.adam_eps}")
        if t.seed < 0:  # numpy's generators take none
            raise ConfigError(f"train.seed must not be negative, got {t.seed}")

    def _validate_training(self) -> None:
        """The training section's rules, and what they need from the data."""
        d, t = self.data, self.train
        if t.out_dir is not None and not str(t.out_dir).strip():  # it trained into runs/<name>, unsaid
            raise ConfigError("train.out_dir is empty; give the run directory, or leave the key out for "
                              f"runs/{self.name}")
        if t.stop_at_target and not t.target_bleu:
            raise ConfigError("train.stop_at_target=true needs train.target_bleu (the validation BLEU to stop at)")
        if t.target_bleu and (d.dataset == "copy" or t.bleu_every == 0):
            raise ConfigError("train.target_bleu needs validation BLEU: translation data (data.dataset=multi30k or "
                              "files) and train.bleu_every of 1 or more; or set train.target_bleu=0 to train without "
                              "a target")
        if t.epochs == 0 and t.max_steps == 0:
            raise ConfigError("train.epochs and train.max_steps are both 0: set one of them to train")
        if d.dataset != "copy" and t.best_metric == "bleu" and t.bleu_every == 0:
            raise ConfigError("train.best_metric=bleu needs validation BLEU, but train.bleu_every is 0; "
                              "set train.bleu_every to 1 or more, or train.best_metric=loss")
        # averaging takes the step files when the run writes them, else the epoch files: enough must be kept
        key, kind = ("keep_last_steps", "step") if t.save_every_steps else ("keep_last_epochs", "epoch")
        kept = getattr(t, key)
        if kept and t.average_last > kept:
            raise ConfigError(f"train.average_last ({t.average_last}) needs that many {kind} checkpoints, but "
                              f"train.{key} is {kept}; raise it or set it to 0 (keep all)")
        if not t.fast and t.compile is not False:
            raise ConfigError(f"train.fast=false runs the notebook's exact path, without torch.compile: drop "
                              f"train.compile={str(t.compile).lower()} or set train.fast=true")
        if not t.fast and self.model.attention_kernel == "fused":
            raise ConfigError("train.fast=false runs the notebook's explicit attention: drop "
                              "model.attention_kernel=fused or set train.fast=true")
        if t.resume is True and t.overwrite:
            raise ConfigError("train.resume and train.overwrite are both true; pick one")
        if t.malloc not in ("auto", "system", "tcmalloc", "mimalloc") and "/" not in t.malloc:
            raise ConfigError("train.malloc must be auto, system, tcmalloc, mimalloc or the path of a malloc library "
                              f"(.so); got {t.malloc!r}")

    def _validate_data(self) -> None:
        """The data section's rules, and what the model needs from it."""
        m, d, t = self.model, self.data, self.train
        if d.src_lang == d.tgt_lang:
            raise ConfigError(f"data.src_lang and data.tgt_lang are both '{d.src_lang}'; they must differ")
        self._validate_corpus()
        if d.spm_sample == 1:
            raise ConfigError("data.spm_sample must be 0 (every sentence) or at least 2 (a sentence pair), got 1")
        if d.max_sentence_len < 3:
            raise ConfigError(f"data.max_sentence_len must be at least 3 (<s>, a token, </s>), "
                              f"got {d.max_sentence_len}")
        if d.max_sentence_len > m.max_positions:
            raise ConfigError(f"data.max_sentence_len ({d.max_sentence_len}) exceeds model.max_positions "
                              f"({m.max_positions})")
        if d.dataset == "copy":
            if d.copy_vocab < 3:
                raise ConfigError(f"data.copy_vocab must be at least 3, got {d.copy_vocab}")
            if d.copy_seq_len < 2:
                raise ConfigError(f"data.copy_seq_len must be at least 2, got {d.copy_seq_len}")
            if t.best_metric == "bleu":
                raise ConfigError("train.best_metric 'bleu' needs translation data; use 'loss' for the copy task")
        if m.tie_embeddings and d.dataset != "copy" and d.tokenizer != "spm":
            raise ConfigError(
                "model.tie_embeddings needs one vocabulary shared by source and target: set data.tokenizer=spm"
            )

    def _validate_corpus(self) -> None:
        """Which languages and files data.dataset can read."""
        d = self.data
        named = [f"data.{key}" for key in ("train", "val", "test") if getattr(d, key)]
        if d.dataset != "files" and named:
            raise ConfigError(f"{', '.join(named)} {'names' if len(named) == 1 else 'name'} your own files, which "
                              f"data.dataset={d.dataset} does not read; set data.dataset=files")
        if d.dataset == "multi30k" and {d.src_lang, d.tgt_lang} != {"de", "en"}:
            raise ConfigError(f"Multi30k is German and English, not {d.src_lang}->{d.tgt_lang}: set data.src_lang and "
                              "data.tgt_lang to de and en (either way round), or data.dataset=files for your own text")
        if d.dataset == "files":
            missing = [f"data.{key}" for key in ("train", "val") if not getattr(d, key)]
            if missing:
                raise ConfigError(f"data.dataset=files needs {' and '.join(missing)}: the path prefix of the "
                                  f"{d.src_lang}/{d.tgt_lang} files (PREFIX.{d.src_lang} and PREFIX.{d.tgt_lang})")
            for key in ("src_lang", "tgt_lang"):
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", getattr(d, key)):
                    raise ConfigError(f"data.{key} '{getattr(d, key)}' is not a language code (letters, digits, - "
                                      "and _): it ends the file names")

    def _validate_objectives(self) -> None:
        """At most one training objective on, those that combine (one wraps the other) counted as one."""
        objectives = self.extensions_on("objective")
        on = [ext.name for ext in objectives if not ext.combines]
        combined = [ext.name for ext in objectives if ext.combines]
        if combined:  # those that combine count as one objective
            on.append(" with ".join(combined))
        if len(on) > 1:
            raise ConfigError(f"{' and '.join(on)} are on together: each replaces the same training loss; "
                              "use one of them")

    def run_dir(self) -> Path:
        """The run directory: train.out_dir, or runs/<name>."""
        return Path(self.train.out_dir) if self.train.out_dir else Path("runs") / self.name
