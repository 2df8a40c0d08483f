"""The budget-aware schedules (warm-up, then linear or cosine decay to the run's last step) and the training clocks."""

from __future__ import annotations

import math

import pytest
import torch

from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.harness.schedules import budget_rate, build_scheduler
from annotated_transformer.optim import build_optimizer, rate


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_budget_rate_warms_up_to_the_noam_peak_and_ends_at_the_final_ratio(shape):
    peak = rate(400, 256, 0.5, 400)  # the peak build_scheduler gives the budget schedules
    assert peak == pytest.approx(0.5 * 256 ** -0.5 * 400 ** -0.5)
    assert peak == max(rate(s, 256, 0.5, 400) for s in range(0, 3001)), "rate is highest at the end of warm-up"
    assert budget_rate(200, 3000, peak, 400, shape) == pytest.approx(peak / 2)  # linear warm-up
    assert budget_rate(400, 3000, peak, 400, shape) == pytest.approx(peak)
    assert budget_rate(3000, 3000, peak, 400, shape, final_ratio=0.1) == pytest.approx(0.1 * peak)
    assert budget_rate(5000, 3000, peak, 400, shape, final_ratio=0.1) == pytest.approx(0.1 * peak)  # held after
    rates = [budget_rate(s, 3000, peak, 400, shape) for s in range(400, 3001, 50)]
    assert all(a >= b for a, b in zip(rates, rates[1:])), "the decay never rises"


def test_budget_rate_midpoints_differ_by_shape():
    peak, mid = 1.0, 400 + (3000 - 400) // 2
    assert budget_rate(mid, 3000, peak, 400, "linear") == pytest.approx(0.5)
    assert budget_rate(mid, 3000, peak, 400, "cosine") == pytest.approx(0.5)
    quarter = 400 + (3000 - 400) // 4
    assert budget_rate(quarter, 3000, peak, 400, "linear") == pytest.approx(0.75)
    assert budget_rate(quarter, 3000, peak, 400, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_scheduler_resumes_exactly_from_its_state_dict():
    def make():
        opt = build_optimizer(torch.nn.Linear(4, 4))
        return opt, build_scheduler(opt, 64, 1.0, 10, "cosine", total_steps=100, final_ratio=0.05)

    opt, sched = make()
    for _ in range(37):
        opt.step()
        sched.step()
    opt2, sched2 = make()
    sched2.load_state_dict(sched.state_dict())
    for _ in range(20):
        opt.step(), sched.step(), opt2.step(), sched2.step()
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert opt.param_groups[0]["lr"] == pytest.approx(budget_rate(57, 100, rate(10, 64, 1.0, 10), 10, "cosine", 0.05))


def small_training(lr_on_device: bool, schedule: str):
    """A tiny model, its fused Adam and a schedule of 4 warm-up steps in a run of 10, as training builds them."""
    from annotated_transformer import make_model
    from annotated_transformer.fast import speed_up_training
    from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute

    torch.manual_seed(0)
    model = make_model(12, 12, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    _, loss_compute, opt = speed_up_training(model, SimpleLossCompute(model.generator, LabelSmoothing(12, 2, 0.1)),
                                             build_optimizer(model))
    sched = build_scheduler(opt, 16, 1.0, 4, schedule, total_steps=10, lr_on_device=lr_on_device)
    return model, loss_compute, opt, sched


def copy_batches(n: int):
    from annotated_transformer import Batch

    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(4, 12, (3, 6), generator=g) for _ in range(n)]
    return [Batch(t, t.clone(), pad=2) for t in tokens]


@pytest.mark.parametrize("schedule", ["noam", "cosine"])
def test_the_rate_on_the_device_is_the_float_schedule_in_one_tensor_and_trains_alike(schedule):
    from annotated_transformer.loop import train_step

    runs = {on: small_training(on, schedule) for on in (False, True)}
    device_rate = runs[True][2].param_groups[0]["lr"]
    assert isinstance(device_rate, torch.Tensor) and device_rate.dim() == 0 and device_rate.dtype == torch.float32
    rates, losses = {False: [], True: []}, {False: [], True: []}
    for batch in copy_batches(12):  # 4 warm-up steps, the decay, and 2 steps past the end of the budget
        for on, (model, loss_compute, opt, sched) in runs.items():
            rates[on].append(float(opt.param_groups[0]["lr"]))
            loss_sum, _ = train_step([batch], model, loss_compute, opt, sched, clip_grad_norm=1.0)
            losses[on].append(loss_sum.item())
        assert runs[True][2].param_groups[0]["lr"] is device_rate  # written in place: a captured step reads it
    assert len(set(rates[False])) > 5  # the rate moved: up in warm-up, down after
    assert rates[True] == [float(torch.tensor(r, dtype=torch.float32)) for r in rates[False]]
    # Adam takes the rate rounded to float32: the losses agree far within what one step's change in rate moves
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=1e-6, atol=0)


def test_a_resumed_run_keeps_its_device_rate_tensor_and_continues_the_schedule():
    from annotated_transformer.harness.loss_meter import LossMeter
    from annotated_transformer.harness.resume import RunState
    from annotated_transformer.loop import TrainState, train_step

    def run_state(lr_on_device: bool) -> RunState:
        model, loss_compute, opt, sched = small_training(lr_on_device, "cosine")
        return RunState(TrainState(), model, opt, sched, loader=None, meter=LossMeter()), loss_compute

    (first, loss_compute), (resumed, _), (plain, _) = run_state(True), run_state(True), run_state(False)
    for batch in copy_batches(6):
        train_step([batch], first.model, loss_compute, first.optimizer, first.scheduler)
    saved = first.state_dict()
    device_rate = resumed.optimizer.param_groups[0]["lr"]
    resumed.load_state_dict(saved)
    plain.load_state_dict(saved)  # a run resumed without the device rate gets its float back
    assert resumed.optimizer.param_groups[0]["lr"] is device_rate
    assert device_rate.item() == first.optimizer.param_groups[0]["lr"].item()
    assert device_rate.item() == float(torch.tensor(plain.optimizer.param_groups[0]["lr"], dtype=torch.float32))
    assert plain.optimizer.param_groups[0]["lr"] == pytest.approx(budget_rate(6, 10, rate(4, 16, 1.0, 4), 4))


def test_a_device_rate_needs_an_optimizer_that_reads_it_on_the_device():
    with pytest.raises(ValueError, match="fused or capturable"):
        build_scheduler(build_optimizer(torch.nn.Linear(2, 2)), 64, 1.0, 10, lr_on_device=True)


def test_budget_schedule_needs_the_run_length():
    opt = build_optimizer(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="total steps"):
        build_scheduler(opt, 64, 1.0, 10, "linear", total_steps=0)


@pytest.mark.parametrize("override, message", [
    ("train.final_lr_ratio=1.5", "final_lr_ratio"),
    ("train.target_bleu=-1", "target_bleu"),
    ("train.schedule=step", "schedule"),
])
def test_bad_schedule_settings_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("tiny", [override])


def test_target_bleu_needs_validation_bleu():
    with pytest.raises(ConfigError, match="needs validation BLEU"):
        load_config("tiny", ["train.target_bleu=30", "train.bleu_every=0"])


@pytest.fixture()
def val_bleu_above_zero(monkeypatch):
    """Validation BLEU one point above what the model scored: a short run's BLEU can be exactly 0 (no 4-gram in
    common) on one CPU kind and not on another, and what these tests check is the target's bookkeeping."""
    from annotated_transformer.harness.tasks import TranslationTask

    score = TranslationTask.score

    def lifted(self, model, device, split="val", *args, **kwargs):
        scored = score(self, model, device, split, *args, **kwargs)
        return {**scored, "bleu": scored["bleu"] + 1.0} if split == "val" else scored

    monkeypatch.setattr(TranslationTask, "score", lifted)


@pytest.mark.slow
@pytest.mark.parametrize("target, reached", [(1e-6, True), (99.0, False)])
def test_epoch_records_carry_the_training_clock_and_the_target(tiny_config, tmp_path, target, reached,
                                                               val_bleu_above_zero):
    from annotated_transformer.harness.run_dir import read_metrics
    from annotated_transformer.harness.trainer import train_worker

    # sentences of up to 12 tokens: a short epoch, and short outputs to score for BLEU
    cfg = tiny_config(f"train.out_dir={tmp_path}", "data.max_sentence_len=12", "data.long_policy=skip",
                      "train.max_steps=40", "train.log_every=20", "train.bleu_every=1",
                      f"train.target_bleu={target}", "train.schedule=linear", "train.warmup=10",
                      "train.progress=false", "train.score_test=false", "decode.max_len_a=10",
                      "train.precision=fp32")
    results = train_worker(cfg)
    records = read_metrics(tmp_path / "metrics.jsonl")
    (epoch,) = [r for r in records if r["kind"] == "epoch"]
    (final,) = [r for r in records if r["kind"] == "final"]
    assert 0 < epoch["train_seconds"] <= epoch["seconds"] <= epoch["wall_seconds"]
    assert epoch["startup_seconds"] > 0 and epoch["eval_seconds"] > 0
    assert [r["lr"] for r in records if r["kind"] == "train"][-1] == 0.0  # the linear decay ends at the last step
    if reached:
        assert epoch["target_epoch"] == 1 and epoch["target_seconds"] == epoch["train_seconds"]
        assert results["target_seconds"] == epoch["train_seconds"]
    else:
        assert "target_epoch" not in epoch and results["target_epoch"] is None
    assert "test_bleu" not in final and final["val_bleu"] == results["val_bleu"]  # train.score_test=false
    assert (tmp_path / final["checkpoint_file"]).is_file()


def test_decoder_depth_can_differ_from_the_encoder_depth():
    from annotated_transformer.runtime.model_flops import train_step_flops
    from annotated_transformer.extensions.builder import build_model
    from annotated_transformer.model import make_model

    cfg = load_config("tiny", ["model.N=3", "model.N_dec=1"])
    model = build_model(cfg, 50, 50)
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 1
    assert len(make_model(50, 50, N=2, d_model=16, d_ff=32, h=2).decoder.layers) == 2  # the paper: N for both
    same, shallow = (train_step_flops(64, 128, 3, 100, [10], [12], n) for n in (None, 1))
    assert shallow < same
    with pytest.raises(ConfigError, match="N_dec"):
        load_config("tiny", ["model.N_dec=-1"])


@pytest.mark.slow
def test_stop_at_target_ends_the_run_at_the_first_epoch_that_reaches_it(tiny_config, tmp_path, val_bleu_above_zero):
    from annotated_transformer.harness.run_dir import RunDir
    from annotated_transformer.harness.trainer import train_worker

    overrides = (f"train.out_dir={tmp_path}", "train.max_steps=0", "train.epochs=3", "data.batch_tokens=8192",
                 "data.max_sentence_len=12", "data.long_policy=skip",  # a short epoch, short outputs to score
                 "train.bleu_every=1", "train.target_bleu=0.000001", "train.stop_at_target=true",
                 "train.progress=false", "train.final_eval=false", "decode.max_len_a=5")
    results = train_worker(tiny_config(*overrides))
    assert results["target_epoch"] == 1
    assert [e for e, _ in RunDir(tmp_path).epoch_files()] == [1]  # epochs 2 and 3 never ran
    assert RunDir(tmp_path).start_mode(tiny_config(*overrides))[0] == "finished"  # and a resume leaves it so
    assert RunDir(tmp_path).start_mode(tiny_config(*overrides[:-4], "train.stop_at_target=false"))[0] == "resume"
    # A new target is timed afresh: an unreached one continues the run, a lower one is found in the metrics.
    mode, last = RunDir(tmp_path).start_mode(tiny_config(*overrides[:-5], "train.target_bleu=1000", *overrides[-4:]))
    assert mode == "resume" and last["train_state"]["target_epoch"] is None
    mode, last = RunDir(tmp_path).start_mode(tiny_config(*overrides[:-5], "train.target_bleu=1e-7", *overrides[-4:]))
    assert mode == "finished" and last["train_state"]["target_epoch"] == 1
    assert last["train_state"]["target_seconds"] == results["target_seconds"]
    with pytest.raises(ConfigError, match="needs train.target_bleu"):
        tiny_config("train.stop_at_target=true")
