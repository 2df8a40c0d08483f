"""The Trainer and its guards: divergence, filesystem errors, resume on real data, DDP accumulation, sync-free steps."""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from annotated_transformer import Batch, LabelSmoothing, TrainState, make_model, run_epoch, train_step
from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import CheckpointError, ConfigError, RunDirError, TrainingDiverged
from annotated_transformer import checkpoints
from annotated_transformer.harness import trainer as trainer_module
from annotated_transformer.checkpoints import load_checkpoint, save_checkpoint
from annotated_transformer.harness.distributed import DistInfo
from annotated_transformer.harness.resume import RunCounters, RunState, StopSignal
from annotated_transformer.harness.run_dir import RunDir
from annotated_transformer.harness.trainer import Trainer, train_worker, wrap_model
from annotated_transformer.harness.loss_meter import LossMeter
from annotated_transformer.harness.schedules import build_scheduler
from annotated_transformer.harness.train_loop import LoopHooks, train_loop
from annotated_transformer.fast import FusedLossCompute, compile_model, fused_adam_pays, speed_up_training
from annotated_transformer.fast.loss import smoothed_cross_entropy
from annotated_transformer.loss import SimpleLossCompute
from annotated_transformer.optim import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["train.progress=false", "train.device=cpu"]


def tiny_model_and_batches(n: int = 4, V: int = 12, seed: int = 0):
    torch.manual_seed(seed)
    model = make_model(V, V, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        t = torch.randint(4, V, (3, 6), generator=g)
        t[:, 0] = 0
        batches.append(Batch(t, t.clone(), pad=2))
    # With the speed training installs (fast/): the step these tests check is the one training runs.
    _, loss_compute, _ = speed_up_training(model, SimpleLossCompute(model.generator, LabelSmoothing(V, 2, 0.1)),
                                           build_optimizer(model))
    return model, loss_compute, batches


def all_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from all_tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from all_tensors(v)


# --------------------------------------------------------------------------- the way in


def test_the_train_command_reaches_train_step_in_the_five_calls_its_docstring_names(train_command, tmp_path,
                                                                                   monkeypatch):
    import inspect
    import re

    import annotated_transformer
    from annotated_transformer.cli import train as train_cli
    from annotated_transformer.harness import train_loop as train_loop_module

    package = Path(annotated_transformer.__file__).resolve().parent
    seen: list[list[str]] = []

    class Reached(Exception):
        """Ends the run at its first step: the way there is all this test wants."""

    def recording_train_step(*args, **kwargs):
        # The package's own functions between the command's main and train_step, outermost first; wrappers from
        # elsewhere (contextlib, torch's decorators) are not a reader's steps and do not count.
        frames = [f for f in inspect.stack(context=0)[1:] if package in Path(f.filename).resolve().parents]
        names = [f.function for f in reversed(frames)]
        seen.append(names[len(names) - 1 - names[::-1].index("main"):])
        raise Reached

    monkeypatch.setattr(train_loop_module, "train_step", recording_train_step)
    with pytest.raises(Reached):
        train_command("--config", "copy.yaml", f"train.out_dir={tmp_path / 'run'}", *QUIET)
    chain = [*seen[0], "train_step"]
    assert len(chain) - 1 <= 5, chain  # calls from cli/train.py's main to train_step
    documented = re.search(r"The way to `train_step`: (.*?)\.\s", " ".join(train_cli.main.__doc__.split()))
    assert documented is not None, train_cli.main.__doc__
    assert [step.split(".")[-1] for step in documented.group(1).split(" -> ")] == chain


# --------------------------------------------------------------------------- divergence


@pytest.mark.slow  # two trainings (3 s on 2 cores alone)
def test_a_diverging_run_stops_with_one_line_exit_3_and_saves_nothing_broken(tmp_path, train_command):
    out = tmp_path / "run"
    common = ["--config", "copy.yaml", f"train.out_dir={out}", "data.copy_batches=5", "train.log_every=5", *QUIET]
    code, _, err = train_command(*common, "train.epochs=2")
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in checkpoint_files(out)}
    code, _, err = train_command(*common, "train.epochs=4", "train.resume=true", "train.lr_factor=1e12")
    assert code == 3, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    line = errors[0]
    assert "training diverged" in line and "nan" in line and "between steps 11 and 15 (epoch 3)" in line
    assert "train.lr_factor" in line and "train.clip_grad_norm" in line and "rerun to continue" in line
    assert f"from {out / 'last.pt'} (step 10, the last good state)" in line
    after = {p.name: p.read_bytes() for p in checkpoint_files(out)}
    assert sorted(after) == ["best.safetensors", "epoch_01.safetensors", "epoch_02.safetensors", "last.pt"]
    assert after == before  # last.pt, the best and the epoch files are untouched
    for path in checkpoint_files(out):
        if path.suffix != ".json":
            assert all(torch.isfinite(t).all() for t in all_tensors(load_checkpoint(path)) if t.is_floating_point())


def checkpoint_files(folder: Path) -> list[Path]:
    """A run's checkpoint files: last.pt and the model files (.safetensors; a .json is an older version's pair)."""
    return [p for p in folder.iterdir() if p.suffix in (".pt", ".safetensors", ".json")]


@pytest.mark.slow  # builds the tiny Multi30k task and trains to a nan (3 s on 2 cores alone)
def test_a_diverging_first_epoch_suggests_starting_again(tiny_config, tmp_path):
    cfg = tiny_config(f"train.out_dir={tmp_path}", "train.lr_factor=1e12", "train.log_every=10", *QUIET)
    with pytest.raises(TrainingDiverged, match=r"between steps 1 and 10 .* train.overwrite=true"):
        train_worker(cfg)
    assert not checkpoint_files(tmp_path)


def test_non_finite_weights_are_never_saved(tmp_path):
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=1", "data.copy_batches=2", *QUIET])
    info, device, run = DistInfo(), torch.device("cpu"), RunDir(tmp_path)
    run.open(cfg, info)
    trainer = Trainer(cfg, info, device, run)
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("inf"))
    with pytest.raises(TrainingDiverged, match="weights are not finite"):
        trainer.checkpoints.save(mid_epoch=False, weights_to=[trainer.run.best])
    trainer.checkpoints.wait()
    run.unlock()
    assert not checkpoint_files(tmp_path)


# --------------------------------------------------------------------------- filesystem errors


def test_a_run_directory_under_a_file_is_one_line_and_exit_2(tmp_path, train_command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={blocker / 'run'}", *QUIET)
    assert code == 2 and err == (f"error: cannot create the run directory {blocker / 'run'}: Not a directory; "
                                 "a part of the path is a file, not a folder; choose another train.out_dir\n")
    code, _, err = train_command("--config", "copy.yaml", f"train.out_dir={blocker}", *QUIET)
    assert code == 2 and err.count("\n") == 1 and "is a file, not a folder" in err
    assert blocker.read_text() == "x"


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_disk_full_while_writing_a_checkpoint_keeps_the_old_files(tmp_path, monkeypatch):
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=3", "data.copy_batches=3", *QUIET])
    real_write = checkpoints.write_checkpoint
    calls = {"n": 0}

    def full_disk(payload, path):
        calls["n"] += 1
        if calls["n"] > 2:  # epoch 1's two writes (the weights, copied to the epoch file; last.pt) fit; then no more
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(payload, path)

    monkeypatch.setattr(checkpoints, "write_checkpoint", full_disk)
    with pytest.raises(RunDirError, match=r"cannot write .*\.safetensors: No space left on device; free some disk"):
        train_worker(cfg)
    assert sorted(p.name for p in checkpoint_files(tmp_path)) == ["best.safetensors", "epoch_01.safetensors",
                                                                  "last.pt"]
    assert load_checkpoint(tmp_path / "last.pt")["train_state"]["epoch"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- the driver's bugs


def test_best_metric_bleu_without_bleu_evaluations_is_refused(tiny_config):
    with pytest.raises(ConfigError, match="train.best_metric=bleu needs validation BLEU, but train.bleu_every is 0"):
        tiny_config("train.best_metric=bleu", "train.bleu_every=0")


@pytest.mark.slow  # about 2.5 s: kept out of the one-minute fast tier
def test_progress_total_equals_the_optimizer_steps(tmp_path, monkeypatch):
    bars = []

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.disable = total, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def write(self, line):
            pass

        def set_postfix(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(trainer_module, "tqdm", Bar)
    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=10",
                               "train.accum_steps=3", *QUIET])
    results = train_worker(cfg)
    assert [(b.total, b.n) for b in bars] == [(4, 4), (4, 4)]  # 10 micro-batches in groups of 3: 3 + 3 + 3 + 1
    assert results["steps"] == 8


@pytest.mark.slow  # about 3 s (a compile): kept out of the one-minute fast tier
def test_accumulation_under_ddp_with_compile_all_reduces_once_per_step(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model, loss_compute, batches = tiny_model_and_batches(n=4)
        wrapped = wrap_model(compile_model(model, True), DistInfo(world_size=2), torch.device("cpu"))
        calls = []

        def counting_hook(state, bucket):
            calls.append(1)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        wrapped.register_comm_hook(None, counting_hook)
        opt = build_optimizer(model, fused=fused_adam_pays(model))  # as training builds it
        _, state = run_epoch(batches, wrapped, loss_compute, opt, build_scheduler(opt, 16, 1.0, 10), accum_iter=2,
                             log=None)
    finally:
        dist.destroy_process_group()
    assert state.step == 2 and state.micro_step == 4
    assert len(calls) == 2  # one bucket all-reduced per optimizer step, not per micro-batch


def test_exact_copies_restores_the_training_mode():
    from annotated_transformer.harness.tasks import exact_copies

    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2)
    model.train()
    exact_copies(model, 11, 5, n=4)
    assert model.training
    model.eval()
    exact_copies(model, 11, 5, n=4)
    assert not model.training


def test_the_fused_loss_backward_leaves_its_saved_gradient_intact():
    crit = LabelSmoothing(7, 2, 0.1)
    logits = torch.randn(5, 7, requires_grad=True)
    target = torch.tensor([0, 3, 2, 6, 1])
    loss = smoothed_cross_entropy(logits, target, crit)
    (2.0 * loss).backward(retain_graph=True)
    first = logits.grad.clone()
    logits.grad = None
    (2.0 * loss).backward()
    assert torch.allclose(logits.grad, first)  # in place, the second backward saw the saved gradient doubled


# --------------------------------------------------------------------------- no host sync in a step


def forbid_host_reads(m: pytest.MonkeyPatch, armed=lambda: True) -> None:
    """While `armed()`, every way Python reads a tensor's value on the host (on a GPU, a wait for it) raises."""

    def trap(real):
        def forbidden(*args, **kwargs):
            if armed():
                raise AssertionError("host synchronisation inside a training step")
            return real(*args, **kwargs)

        return forbidden

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        m.setattr(torch.Tensor, name, trap(getattr(torch.Tensor, name)))
    m.setattr(torch, "tensor", trap(torch.tensor))


def test_train_step_never_reads_a_tensor_on_the_host(monkeypatch):
    model, loss_compute, batches = tiny_model_and_batches(n=2)
    for b in batches:
        b.global_ntokens = 2 * b.ntokens
    opt = build_optimizer(model, fused=fused_adam_pays(model))  # as training builds it
    sched = build_scheduler(opt, 16, 1.0, 10)
    with monkeypatch.context() as m:
        forbid_host_reads(m)
        with pytest.raises(AssertionError, match="host synchronisation inside a training step"):  # the trap works
            torch.ones(1).item()
        loss_sum, grad_norm = train_step(batches, model, loss_compute, opt, sched, clip_grad_norm=1.0, ws=2)
    assert loss_sum.item() > 0 and grad_norm.item() > 0 and sched.last_epoch == 1


def steps_then_read(model, loss_compute, batches, opt, sched, between_steps,
                    amp_dtype: torch.dtype | None = None) -> tuple[float, TrainState]:
    """`train_loop` over `batches` with no log line; `between_steps(last)` runs after each step (last: the final
    one, before the epoch's loss is read)."""
    state = TrainState()

    def should_stop() -> bool:
        between_steps(state.step == len(batches))
        return False

    loss = train_loop(batches, model, loss_compute, opt, sched, state, amp_dtype=amp_dtype, clip_grad_norm=1.0,
                      log_every=10_000, hooks=LoopHooks(log=None, should_stop=should_stop))
    return loss, state


def test_the_loop_with_the_rate_on_the_device_reads_no_tensor_on_the_host_between_log_lines(monkeypatch):
    # train.compile=captured's loop as far as a CPU runs it (no CUDA graphs): the steps, the loss sums and the
    # schedule's device rate never read a tensor; the epoch's loss is read once at its end
    model, loss_compute, batches = tiny_model_and_batches(n=4)
    opt = build_optimizer(model, fused=fused_adam_pays(model))
    sched = build_scheduler(opt, 16, 1.0, 2, lr_on_device=True)
    armed = [True]
    with monkeypatch.context() as m:
        forbid_host_reads(m, armed=lambda: armed[0])
        loss, state = steps_then_read(model, loss_compute, batches, opt, sched,
                                      between_steps=lambda last: armed.__setitem__(0, not last))
    assert state.step == 4 and sched.last_epoch == 4 and math.isfinite(loss)
    figures = []  # a log line reads the rate too, as a number for the metrics file
    train_loop(batches[:1], model, loss_compute, opt, sched, state, log_every=1,
               hooks=LoopHooks(log=None, on_log=figures.append))
    device_rate = opt.param_groups[0]["lr"]
    assert isinstance(device_rate, torch.Tensor) and type(figures[0]["lr"]) is float
    assert figures[0]["lr"] == device_rate.item() > 0


def cuda_training(captured: bool, info: DistInfo = DistInfo()):
    """The tiny model on the GPU with fused Adam as training builds it (`wrap_model`: DDP where `info` says so);
    with `captured`, train.compile=captured's step (torch.compile's CUDA graphs, the rate on the device)."""
    model, loss_compute, batches = tiny_model_and_batches(n=2)
    model = model.cuda()
    loss_compute = FusedLossCompute(model.generator, loss_compute.criterion)
    opt = build_optimizer(model, fused=fused_adam_pays(model))
    sched = build_scheduler(opt, 16, 1.0, 10, lr_on_device=captured)
    wrapped = wrap_model(compile_model(model, "captured" if captured else False), info, torch.device("cuda", 0))
    return wrapped, loss_compute, [b.to("cuda") for b in batches], opt, sched


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU test above checks the same path)")
def test_train_step_runs_under_cuda_sync_debug_mode_error():
    model, loss_compute, batches, opt, sched = cuda_training(captured=False)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            train_step(batches, model, loss_compute, opt, sched, amp_dtype=torch.bfloat16, clip_grad_norm=1.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sched.last_epoch == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU test above checks the loop)")
def test_the_captured_loop_runs_under_cuda_sync_debug_mode_error_between_log_lines():
    model, loss_compute, batches, opt, sched = cuda_training(captured=True)
    bf16 = torch.bfloat16
    steps_then_read(model, loss_compute, batches * 2, opt, sched, lambda last: None, bf16)  # recorded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # replayed: nothing between the steps may wait for the GPU, until the epoch's loss is read
        loss, state = steps_then_read(model, loss_compute, batches * 2, opt, sched, lambda last: (
            torch.cuda.set_sync_debug_mode("default" if last else "error")), bf16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert state.step == 4 and sched.last_epoch == 8 and math.isfinite(loss)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (DDP on the CPU: above)")
def test_ddp_around_the_captured_step_gives_the_eager_losses_within_bf16_noise(tmp_path):
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        losses = {}
        for captured, info in ((False, DistInfo()), (True, DistInfo(world_size=2))):  # DDP over the one rank
            model, loss_compute, batches, opt, sched = cuda_training(captured, info)
            assert isinstance(model, torch.nn.parallel.DistributedDataParallel) == captured
            losses[captured] = [train_step(batches, model, loss_compute, opt, sched, amp_dtype=torch.bfloat16,
                                           clip_grad_norm=1.0)[0].item() for _ in range(6)]  # 2 micro-batches a step
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------- resume


def without_clocks(record: dict) -> dict:
    """A record or train_state without its clocks (time stamps, durations, speeds), which no two runs share."""
    return {k: v for k, v in record.items() if k not in ("time", "tokens_per_s") and not k.endswith("seconds")}


def metrics_without_clocks(path: Path) -> list[dict]:
    """metrics.jsonl without clocks and without the start records (a resumed process logs its own)."""
    return [without_clocks(r) for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") != "start"]


def sigterm_at(monkeypatch, step: int) -> None:
    """This process gets a real SIGTERM right after optimizer step `step` (before the trainer looks for one)."""
    real_should_stop = Trainer._should_stop

    def should_stop(self):
        if self.train_state.step == step:
            # Without the trainer's handler SIGTERM would end pytest itself: fail this test instead.
            handler = signal.getsignal(signal.SIGTERM)
            assert isinstance(getattr(handler, "__self__", None), StopSignal), f"SIGTERM is handled by {handler!r}"
            os.kill(os.getpid(), signal.SIGTERM)
        return real_should_stop(self)

    monkeypatch.setattr(Trainer, "_should_stop", should_stop)


def test_a_signal_delivered_twice_is_one_stop_and_a_later_ctrl_c_stops_at_once(monkeypatch):
    """`uv run` without a terminal (or `timeout -s INT`) forwards the SIGINT the process group got: the copy that
    arrives at once is the same stop, which saves last.pt; a Ctrl-C a while later still stops at once."""
    from annotated_transformer.harness import resume

    clock = [100.0]
    monkeypatch.setattr(resume.time, "monotonic", lambda: clock[0])
    stop = StopSignal()
    stop._handle(signal.SIGINT, None)
    clock[0] += 0.01
    stop._handle(signal.SIGINT, None)  # the forwarded copy
    assert stop.signum == signal.SIGINT and stop.stop_now(False)
    clock[0] += resume.SAME_SIGNAL_SECONDS + 0.5
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_is_bit_identical(tmp_path, multi30k_dir, data_cache_dir, train_command,
                                                       monkeypatch):
    """SIGTERM inside epoch 2, then the same command: the weights, the Adam moments, the counters and every
    metrics line equal an uninterrupted run's (dropout on, so the random state is restored too). The three runs
    are the train command in this process; the signal is a real one, sent by the process to itself."""
    common = ["--config", "tiny.yaml", f"data.root={multi30k_dir}", f"data.cache_dir={data_cache_dir}",
              "data.max_sentence_len=10", "data.long_policy=skip", "train.max_steps=0", "train.epochs=2",
              "train.log_every=1", "train.final_eval=false", "model.dropout=0.1", *QUIET]
    code, out, err = train_command(*common, f"train.out_dir={tmp_path / 'full'}")
    assert code == 0, err
    per_epoch = int(out.split(" batches/epoch/rank")[0].rsplit("| ", 1)[1])
    assert per_epoch >= 6

    part = tmp_path / "part"
    handler_before = signal.getsignal(signal.SIGTERM)
    at = per_epoch + per_epoch // 3  # inside epoch 2
    with monkeypatch.context() as m:
        sigterm_at(m, at)
        code, out, err = train_command(*common, f"train.out_dir={part}")
    assert code == 128 + signal.SIGTERM, err
    assert f"stopped by SIGTERM in epoch 2 at step {at}" in out and "run the same command again to continue" in out
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the trainer's handler is gone again
    stopped = load_checkpoint(part / "last.pt")
    assert stopped["train_state"]["step"] == at and stopped["train_state"]["epoch"] == 1
    assert stopped["meter"]["epoch_tokens"] > 0 and stopped["loader"]["taken"] == at - per_epoch

    code, out, err = train_command(*common, f"train.out_dir={part}")  # train.resume=auto
    assert code == 0, err
    assert f"resumed {part / 'last.pt'}: in epoch 2 at step {at}" in out
    a, b = load_checkpoint(tmp_path / "full" / "last.pt"), load_checkpoint(part / "last.pt")
    assert a["train_state"]["step"] == b["train_state"]["step"] == 2 * per_epoch
    assert without_clocks(a["train_state"]) == without_clocks(b["train_state"])
    assert b["train_state"]["train_seconds"] > 0
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert len(a["optimizer"]["state"]) == len(b["optimizer"]["state"]) > 0
    for moments_a, moments_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(moments_a["exp_avg"], moments_b["exp_avg"])
        assert torch.equal(moments_a["exp_avg_sq"], moments_b["exp_avg_sq"])
    # every metrics line, the resumed epoch's train_loss over the whole epoch included
    assert metrics_without_clocks(part / "metrics.jsonl") == metrics_without_clocks(tmp_path / "full" / "metrics.jsonl")


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_an_older_last_pt_resumes_and_a_weights_only_file_is_refused(tmp_path, train_command):
    out = tmp_path / "run"
    cfg = ["--config", "copy.yaml", f"train.out_dir={out}", "data.copy_batches=4", *QUIET]
    assert train_command(*cfg, "train.epochs=1")[0] == 0
    old = load_checkpoint(out / "last.pt")
    old.pop("format")
    old.pop("meter")  # files written before the loss sums were saved
    save_checkpoint(old, out / "last.pt")
    code, _, err = train_command(*cfg, "train.epochs=2", "train.resume=true")
    assert code == 0, err
    assert load_checkpoint(out / "last.pt")["train_state"]["epoch"] == 2

    weights_only = load_checkpoint(out / "best.pt")
    weights_only.pop("format")
    save_checkpoint(weights_only, out / "last.pt")
    code, _, err = train_command(*cfg, "train.epochs=3", "train.resume=true")
    assert code == 2
    assert err == (f"error: {out / 'last.pt'} is not a resumable checkpoint (no optimizer, "
                   "scheduler, rng); resume from the run's last.pt, or start a new run\n")
    with pytest.raises(CheckpointError, match=r"^last\.pt is not a resumable checkpoint \(no train_state, optimizer"):
        RunState(TrainState(), *([None] * 4), LossMeter()).load_state_dict({"model": {}})


# last.pt's train_state as written while TrainState also held the run's epochs, clocks and best score
FLAT_TRAIN_STATE = {"step": 40, "micro_step": 80, "samples": 900, "tokens": 12000, "epoch": 2, "best_metric": 1.25,
                    "best_epoch": 2, "train_seconds": 30.5, "wall_seconds": 41.0, "target_epoch": None,
                    "target_seconds": None, "flops": 3e12, "target_flops": None}


def test_a_last_pt_from_before_the_run_counters_left_train_state_resumes_every_counter():
    """TrainState keeps what the loop counts, the harness's RunCounters the rest; last.pt's train_state stays one
    flat dict, so a file written when TrainState held all 13 resumes with each of them, and is written as it was
    (with the counters added since after them)."""
    def run_state() -> RunState:
        model = torch.nn.Linear(2, 2)
        optimizer = build_optimizer(model)
        return RunState(TrainState(), model, optimizer, build_scheduler(optimizer, 16, 1.0, 4), None, LossMeter())

    resumed = run_state()
    resumed.load_state_dict({**run_state().state_dict(), "train_state": dict(FLAT_TRAIN_STATE)})
    assert resumed.train_state == TrainState(step=40, micro_step=80, samples=900, tokens=12000)
    assert resumed.counters == RunCounters(epoch=2, best_metric=1.25, best_epoch=2, train_seconds=30.5,
                                           wall_seconds=41.0, flops=3e12)
    written = list(resumed.state_dict()["train_state"].items())
    assert written == [*FLAT_TRAIN_STATE.items(), ("best_step", 0)]  # the same dict, and the step of the best since


def test_a_meter_saved_by_one_process_keeps_exact_counts_and_an_older_file_still_loads():
    stopped = LossMeter()
    stopped.add(torch.tensor(3.0), tokens=(1 << 24) + 1)  # past float32's exact integers
    saved = stopped.state_dict()
    assert saved["epoch_tokens"] == (1 << 24) + 1 and saved["ranks"] == 1
    older = {k: v for k, v in saved.items() if k != "ranks"}  # a last.pt written before the count of ranks
    for state in (saved, older):
        resumed = LossMeter()
        resumed.load_state_dict(state)
        assert resumed.epoch_tokens == (1 << 24) + 1 and resumed.read_epoch() == pytest.approx(3.0 / ((1 << 24) + 1))


def test_a_resumed_log_window_times_only_the_steps_of_this_process(monkeypatch):
    """A window continued from last.pt keeps its earlier steps' loss, but its tokens/s counts only new steps."""
    import annotated_transformer.harness.loss_meter as loss_meter

    stopped = LossMeter()
    stopped.add(torch.tensor(30.0), tokens=1000)  # steps run before the stop, in another process
    resumed = LossMeter()
    resumed.load_state_dict(stopped.state_dict())
    monkeypatch.setattr(loss_meter.time, "perf_counter", lambda: 100.0)
    resumed.start_clock()  # the epoch's steps begin (after loading last.pt and the rest of the set-up)
    resumed.add(torch.tensor(6.0), tokens=200)
    monkeypatch.setattr(loss_meter.time, "perf_counter", lambda: 102.0)
    window = resumed.read_window()
    assert window["tokens_per_s"] == pytest.approx(100.0)  # 200 tokens in 2 s, not 1,200
    assert window["loss"] == pytest.approx(36.0 / 1200)
    resumed.add(torch.tensor(1.0), tokens=50)
    monkeypatch.setattr(loss_meter.time, "perf_counter", lambda: 103.0)
    assert resumed.read_window()["tokens_per_s"] == pytest.approx(50.0)  # the next window starts from zero


# --------------------------------------------------------------------------- TensorBoard


@pytest.mark.slow  # about 2.5 s: kept out of the one-minute fast tier
def test_tensorboard_event_files_hold_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config("copy", [f"train.out_dir={tmp_path}", "train.epochs=2", "data.copy_batches=10",
                               "train.log_every=5", "train.tensorboard=true", *QUIET])
    train_worker(cfg)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    logged = events.Scalars("train/loss")
    assert [e.step for e in logged] == [r["step"] for r in train] == [5, 10, 15, 20]
    assert [e.value for e in logged] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    assert [e.value for e in events.Scalars("epoch/val_loss")] == pytest.approx([r["val_loss"] for r in epochs],
                                                                                rel=1e-6)
    assert {"train/lr", "train/tokens_per_s", "epoch/train_loss"} <= set(events.Tags()["scalars"])


def test_tensorboard_without_the_package_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when not installed
    run = tmp_path / "run"
    cfg = load_config("copy", [f"train.out_dir={run}", "train.epochs=1", "train.tensorboard=true", *QUIET])
    with pytest.raises(ConfigError, match=r"train.tensorboard=true needs the tensorboard package: .*uv sync --extra"):
        train_worker(cfg)
    assert not run.exists()  # decided before anything is written: the folder the lock made is gone with it


# --------------------------------------------------------------------------- training compute


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_metrics_count_the_model_flops_of_every_step_and_r_drop_twice(tmp_path):
    from annotated_transformer.runtime.model_flops import train_step_flops

    per_epoch = train_step_flops(128, 256, 2, 11, [10] * 16 * 6, [9] * 16 * 6)  # 6 batches of 16 copies
    for name, extra, factor in (("plain", [], 1.0), ("rdrop", ["r_drop.alpha=1"], 2.0)):
        cfg = load_config("copy", [f"train.out_dir={tmp_path / name}", "train.epochs=2", "data.copy_batches=6",
                                   "data.copy_batch_size=16",
                                   "train.final_eval=false", *extra, *QUIET])
        results = train_worker(cfg)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        counted = [r["train_flops"] for r in records if r["kind"] == "epoch"]
        assert counted == pytest.approx([factor * per_epoch, 2 * factor * per_epoch], rel=1e-9)
        assert results["train_flops"] == pytest.approx(counted[-1])
