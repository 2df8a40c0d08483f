"""Shared fixtures.

Real Multi30k data: the six files are found through $MULTI30K_DIR, else in the `shared/data/multi30k`
folder beside the project checkout. Without them the tests that need them are skipped, unless
REQUIRE_MULTI30K=1 (CI), where a missing folder is a failure.

Every CPU kind the project meets runs the same suite (Intel with AMX, AMD Zen 4/5 with AVX512-BF16, AVX2-only
CPUs in fp32), so the suite fixes what would otherwise come from the shell that started it: two compute threads
here and in the processes the tests start, and no malloc preloaded or tuned (they change page faults and
timings, and a preloaded library is inherited by every child). The variables that choose kernels on purpose
stay: ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS run an older CPU's path on a newer
one (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2` is an AVX2-only CPU in
fp32; `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` is bf16 without AMX, as on AMD), and
ANNOTATED_TRANSFORMER_ONEDNN_LINEAR=1 decodes fp32 through oneDNN as on AMD CPUs.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# Set before torch starts its thread pool in this process, and inherited by every process a test starts.
TEST_THREADS = 2
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(TEST_THREADS)
for _name in [n for n in os.environ if n.startswith("MALLOC_")] + ["LD_PRELOAD", "GLIBC_TUNABLES"]:
    os.environ.pop(_name, None)
os.environ["ANNOTATED_TRANSFORMER_MALLOC"] = "system"  # no train command restarts under tcmalloc or mimalloc

import torch  # noqa: E402

torch.set_num_threads(TEST_THREADS)

from annotated_transformer.config import Config, DataConfig  # noqa: E402
from annotated_transformer.config import load_config  # noqa: E402

@pytest.fixture()
def no_charts(monkeypatch):
    """The end of a run without its charts (drawing them takes seconds; they are not what these tests check)."""
    from annotated_transformer.harness import run_end

    monkeypatch.setattr(run_end, "write_charts", lambda run, log: None)


# Where the data is without MULTI30K_DIR: beside the checkout (CI's layout), then where training downloads it.
DEFAULT_MULTI30K_DIRS = (Path(__file__).resolve().parents[2] / "shared/data/multi30k",
                         Path(DataConfig().cache_dir).expanduser() / "multi30k")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The folder with the six Multi30k .gz files (skips, or fails under REQUIRE_MULTI30K=1, when absent)."""
    env = os.environ.get("MULTI30K_DIR")
    found = [d for d in DEFAULT_MULTI30K_DIRS if (d / "train.de.gz").is_file()]
    folder = Path(env).expanduser() if env else (found or DEFAULT_MULTI30K_DIRS)[0]
    if not (folder / "train.de.gz").is_file():
        reason = (f"Multi30k data not found in {folder} " + ("(from MULTI30K_DIR)" if env else
                  f"or {DEFAULT_MULTI30K_DIRS[1]} (set MULTI30K_DIR to the folder with the six .gz files, or "
                  "train a Multi30k config once: it downloads them)"))
        if os.environ.get("REQUIRE_MULTI30K") == "1":
            pytest.fail(f"{reason}; REQUIRE_MULTI30K=1 makes this an error")
        pytest.skip(reason)
    return folder


@pytest.fixture(scope="session")
def data_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tokenised-data cache for the whole test session (never ~/.cache)."""
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture(scope="session")
def tiny_config(multi30k_dir: Path, data_cache_dir: Path):
    """A factory: the tiny Multi30k config with the real data and the session cache, in fp32, plus overrides.

    fp32, because `train.precision=auto` is bf16 on CPUs with AVX512-BF16 or AMX and fp32 elsewhere, and a short
    run's figures (a val BLEU above 0, the session's tiny checkpoint) would then differ by CPU kind. A test of bf16
    training passes `train.precision=bf16` (a later override wins).
    """

    def make(*overrides: str) -> Config:
        return load_config("tiny", [f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
                                    "train.precision=fp32", *overrides])

    return make


@pytest.fixture(scope="session")
def multi30k_data(tiny_config):
    """Multi30k tokenised once per session (word mode, tiny config): a TranslationData."""
    from annotated_transformer.data import load_translation_data

    return load_translation_data(tiny_config(), log=None)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best model file (best.safetensors) of a tiny Multi30k model trained once per session (60 steps; it
    learns little).

    The end-of-training BLEU pass is switched off (train.final_eval=false) and outputs are capped
    at source length + 10 tokens, which keeps the run-on translations of an untrained model short.
    The run directory beside it holds the usual files (metrics.jsonl, vocab/, config.yaml), no charts.
    """
    from annotated_transformer.harness import run_end
    from annotated_transformer.harness.trainer import train_worker

    run_dir = tmp_path_factory.mktemp("tiny_run")
    cfg = tiny_config(f"train.out_dir={run_dir}", "train.overwrite=true", "train.max_steps=60",
                      "train.log_every=20", "train.progress=false", "train.device=cpu", "decode.max_len_a=10",
                      "train.final_eval=false")
    with pytest.MonkeyPatch.context() as patch:  # as `no_charts`: no test reads this run's charts
        patch.setattr(run_end, "write_charts", lambda run, log: None)
        train_worker(cfg)
    return run_dir / "best.safetensors"


@pytest.fixture(scope="session")
def word_mode_scores(multi30k_dir: Path):
    """A function: sacreBLEU's scores of word-mode hypotheses against the first len(hyps) English references of a
    split ('val' or 'test'), computed here from the raw .gz file (references spaCy-tokenised, as word mode
    compares them) instead of by the project's scorer: {"bleu", "bleu_lc", "chrf"}."""
    import gzip

    from sacrebleu.metrics import BLEU, CHRF

    from annotated_transformer.data.tokenizers import word_tokenize

    files = {"val": "val.en.gz", "test": "test_2016_flickr.en.gz"}
    tokenised: dict[str, list[str]] = {}

    def scores(hyps: list[str], split: str) -> dict[str, float]:
        if split not in tokenised:
            with gzip.open(multi30k_dir / files[split], "rt", encoding="utf-8") as f:
                tokenised[split] = [" ".join(word_tokenize(line, "en")) for line in f.read().split("\n")]
        refs = tokenised[split][: len(hyps)]
        return {"bleu": BLEU(tokenize="none", force=True).corpus_score(hyps, [refs]).score,
                "bleu_lc": BLEU(tokenize="none", lowercase=True, force=True).corpus_score(hyps, [refs]).score,
                "chrf": CHRF().corpus_score(hyps, [refs]).score}

    return scores


def _run_command(command: str, *args: str, stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    import io
    import sys

    from annotated_transformer.cli import run

    streams = [io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="") for data in (stdin, b"", b"")]
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = streams
    try:
        run(command, [str(a) for a in args], f"scripts/{command}.py")
    except SystemExit as exc:
        code = exc.code
    else:  # pragma: no cover - run() always ends with SystemExit
        raise AssertionError(f"{command} returned without an exit code")
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    for stream in streams[1:]:
        stream.flush()
    return code, streams[1].buffer.getvalue(), streams[2].buffer.getvalue()


@pytest.fixture(scope="session")
def weights_only_roundtrip():
    """A function: `obj` saved with torch.save and read back with weights_only=True, as a checkpoint is."""
    import io

    def roundtrip(obj):
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)

    return roundtrip


@pytest.fixture(scope="session")
def mid_epoch_resume(weights_only_roundtrip):
    """A function: `mid_epoch_resume(make_loader, epoch, taken)` stops a loader from `make_loader()` after `taken`
    batches of `epoch`, saves its state as a checkpoint holds it, loads that into a fresh loader (set to another
    epoch first, as a new process does) and asserts the batches taken and the rest are the uninterrupted epoch's;
    returns (the saved state, the fresh loader, the uninterrupted epoch's batches)."""

    def resume(make_loader, epoch: int, taken: int) -> tuple[dict, object, list]:
        full = make_loader()
        full.set_epoch(epoch)
        full = list(full)
        first = make_loader()
        first.set_epoch(epoch)
        it = iter(first)
        before = [next(it) for _ in range(taken)]
        state = weights_only_roundtrip(first.state_dict())
        second = make_loader()
        second.set_epoch(0)
        second.load_state_dict(state)
        rest = list(second)
        assert len(before) + len(rest) == len(full)
        for a, b in zip(before + rest, full):
            assert torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt) and torch.equal(a.tgt_y, b.tgt_y)
        return state, second, full

    return resume


@pytest.fixture(scope="session")
def command():
    """A function: `command(name, *args, stdin=b"")` runs `python -m annotated_transformer NAME ARGS` (what
    scripts/NAME.py runs) in this process, with `stdin` as its standard input; returns (exit code, stdout bytes,
    stderr bytes). A command is a process only where the test is about the process."""
    return _run_command


@pytest.fixture(scope="session")
def train_command():
    """A function: `train_command(*args)` runs the train command in this process (as `command("train", ...)`),
    returning (exit code, stdout, stderr) as text."""

    def train(*args: str) -> tuple[int, str, str]:
        code, out, err = _run_command("train", *args)
        return code, out.decode("utf-8"), err.decode("utf-8")

    return train


@pytest.fixture(autouse=True)
def sigint_handler_kept():
    """Each test leaves SIGINT's handler as it found it: a command run in this process after a Ctrl-C ignores the
    keypress's second copy for a second (`ignore_same_keypress`), which must not reach the next test."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def ctrl_c_during_import(monkeypatch):
    """A function: `ctrl_c_during_import(name, met, module)` makes `import name` receive a Ctrl-C while it runs,
    which the import meets as a C extension's start-up does: `met()` is called with the KeyboardInterrupt caught (it
    returns to swallow it, as torch does, or raises another error, as pybind11 does); then `module()` is what the
    import gives."""
    import builtins
    import time

    real_import = builtins.__import__

    def install(name: str, met, module) -> None:
        def importing(wanted, *args, **kwargs):
            if wanted != name:
                return real_import(wanted, *args, **kwargs)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # a Python handler runs here
            except KeyboardInterrupt:
                met()
            return module()

        monkeypatch.setattr(builtins, "__import__", importing)

    return install
