"""fast/: speed installed on the notebook's classes from outside, and the same results with it off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from annotated_transformer.decode.beam_search import beam_search
from annotated_transformer.extensions.builder import build_training
from annotated_transformer.fast import FastDropout, FusedLossCompute, fused_adam_pays, slow_down, speed_up
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute
from annotated_transformer.masks import padding_mask, subsequent_mask
from annotated_transformer.model import make_model
from annotated_transformer.decode.query_grid import grouped_queries


def small_model(dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    return make_model(23, 23, N=2, d_model=32, d_ff=64, h=4, dropout=dropout, tie_embeddings=True)


def batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 23, (3, 7), generator=g), torch.randint(3, 23, (3, 6), generator=g)
    src[0, 5:] = 0
    return src, tgt, padding_mask(src, 0), subsequent_mask(tgt.size(1)).expand(3, -1, -1)


def test_make_model_builds_the_notebooks_classes_and_speed_up_swaps_only_the_dropout():
    model = small_model()
    kinds = {type(m) for m in model.modules()}
    assert nn.Dropout in kinds and FastDropout not in kinds
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dropouts = [m for m in model.modules() if type(m) is nn.Dropout]
    assert speed_up(model) is model
    assert all(type(m) is FastDropout for m in dropouts) and nn.Dropout not in {type(m) for m in model.modules()}
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)
    slow_down(model)
    assert all(type(m) is nn.Dropout for m in dropouts)


@pytest.mark.parametrize("dropout, mode", [(0.0, "train"), (0.3, "eval")])
def test_outputs_and_gradients_are_the_same_with_speed_on_and_off(dropout, mode):
    """Where no random mask is drawn, the installed speed changes nothing: outputs, loss and every gradient."""
    results = []
    for fast in (False, True):
        model = small_model(dropout)
        getattr(model, mode)()
        if fast:
            speed_up(model)
        crit = LabelSmoothing(23, 0, 0.1)
        loss_compute = (FusedLossCompute if fast else SimpleLossCompute)(model.generator, crit)
        src, tgt, src_mask, tgt_mask = batch()
        out = model(src, tgt, src_mask, tgt_mask)
        total, loss = loss_compute(out, torch.roll(tgt, -1, 1), 11.0)
        loss.backward()
        results.append((out.detach(), total, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (out_a, loss_a, grads_a), (out_b, loss_b, grads_b) = results
    assert torch.equal(out_a, out_b)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-5)  # the fused loss sums in another order
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_fast_dropout_draws_a_mask_of_the_same_rate_as_pytorchs():
    torch.manual_seed(2)
    x = torch.ones(200, 500)
    kept = {cls: (cls(0.3).train()(x) != 0).float().mean().item() for cls in (nn.Dropout, FastDropout)}
    assert abs(kept[nn.Dropout] - 0.7) < 0.01 and abs(kept[FastDropout] - 0.7) < 0.01


def test_training_builds_the_speed_in(tiny_config):
    model, loss_compute, _, optimizer, _ = build_training(tiny_config(), 50, 50, 2, torch.device("cpu"))
    assert type(loss_compute) is FusedLossCompute and loss_compute.fused
    assert {type(m) for m in model.modules()} & {nn.Dropout, FastDropout} == {FastDropout}
    assert fused_adam_pays(model) and optimizer.defaults["fused"]


def test_beam_search_groups_queries_only_while_it_runs_and_gives_the_layers_back_after_an_error():
    model = small_model().eval()
    linears = [(layer.src_attn.linears[0], layer.src_attn.linears[3]) for layer in model.decoder.layers]
    src, _, src_mask, _ = batch()
    with torch.no_grad():
        out = beam_search(model, src, src_mask, 9, 1, 2, beam_size=3)
    assert out.size(0) == 3
    assert [(layer.src_attn.linears[0], layer.src_attn.linears[3]) for layer in model.decoder.layers] == linears
    with pytest.raises(RuntimeError, match="inside the search"), grouped_queries(model):
        assert type(model.decoder.layers[0].src_attn.linears[0]) is not nn.Linear
        raise RuntimeError("inside the search")
    assert all(type(m) is nn.Linear for pair in linears for m in pair)
    assert [(layer.src_attn.linears[0], layer.src_attn.linears[3]) for layer in model.decoder.layers] == linears
    assert {k for k in model.state_dict()} == {k for k in small_model().state_dict()}


def test_the_plain_optimizer_is_pytorchs_adam_and_training_asks_for_the_fused_one():
    from annotated_transformer.optim import build_optimizer

    model = small_model()
    assert not build_optimizer(model).defaults["fused"]
    assert build_optimizer(model, fused=fused_adam_pays(model)).defaults["fused"]


def test_train_compile_takes_false_true_or_captured_and_captured_needs_a_gpu(tiny_config, tmp_path, train_command):
    from annotated_transformer.runtime.errors import ConfigError
    from annotated_transformer.fast import compile_model

    assert tiny_config("train.compile=captured").train.compile == "captured"
    assert tiny_config("train.compile=true").train.compile is True
    with pytest.raises(ConfigError, match="train.compile"):
        tiny_config("train.compile=graphs")
    model = small_model()
    assert compile_model(model, False) is model
    with pytest.raises(ConfigError, match="^train.compile=captured replays CUDA graphs, but the model is on cpu"):
        compile_model(model, "captured")
    code, _, err = train_command("--config", "tiny", "train.compile=captured", "train.device=cpu",
                                 f"train.out_dir={tmp_path / 'run'}", "train.max_steps=1", "train.progress=false")
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: train.compile=captured replays CUDA graphs")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (the CPU test above checks "
                    "the option)")
def test_captured_steps_give_the_eager_losses_within_bf16_noise():
    from annotated_transformer.data import Batch
    from annotated_transformer.fast import compile_model
    from annotated_transformer.harness.schedules import build_scheduler
    from annotated_transformer.loop import train_step
    from annotated_transformer.optim import build_optimizer

    g = torch.Generator().manual_seed(3)
    shapes = [(4, 7), (6, 5), (4, 7), (6, 5), (4, 7), (6, 5)]  # two shapes, each recorded once and replayed
    batches = [Batch(torch.randint(3, 23, (b, n), generator=g), torch.randint(3, 23, (b, n + 1), generator=g), pad=0)
               for b, n in shapes]
    losses = {}
    for mode in (False, "captured"):
        model = speed_up(small_model(dropout=0.0).cuda())
        opt = build_optimizer(model, fused=fused_adam_pays(model))
        sched = build_scheduler(opt, 32, 1.0, 10, lr_on_device=mode == "captured")  # as the Trainer builds them
        step_model = compile_model(model, mode)
        lc = FusedLossCompute(model.generator, LabelSmoothing(23, 0, 0.1))
        losses[mode] = [train_step([b.to("cuda")], step_model, lc, opt, sched, amp_dtype=torch.bfloat16,
                                   clip_grad_norm=1.0)[0].item() for b in batches]
    torch.testing.assert_close(torch.tensor(losses["captured"]), torch.tensor(losses[False]), rtol=2e-2, atol=2e-2)


def graphed_against_train_step(device: str, record: bool, amp_dtype: torch.dtype | None) -> dict[str, list[float]]:
    """Six steps over two batch shapes, by train_step and by the GPU check's GraphedStep, from the same weights."""
    from annotated_transformer.data import Batch
    from annotated_transformer.harness.schedules import build_scheduler
    from annotated_transformer.lab.graphed_step import GraphedStep
    from annotated_transformer.loop import step_norm, train_step
    from annotated_transformer.optim import build_optimizer

    g = torch.Generator().manual_seed(4)
    shapes = [(4, 7), (6, 5), (4, 7), (6, 5), (4, 7), (6, 5)]
    batches = [Batch(torch.randint(3, 23, (b, n), generator=g), torch.randint(3, 23, (b, n + 1), generator=g),
                     pad=0).to(device) for b, n in shapes]
    losses = {}
    for way in ("train_step", "graphed"):
        torch.manual_seed(0)
        model = speed_up(small_model(dropout=0.0).to(device))
        opt = build_optimizer(model, fused=True)
        sched = build_scheduler(opt, 32, 1.0, 10, lr_on_device=True)
        lc = FusedLossCompute(model.generator, LabelSmoothing(23, 0, 0.1))
        step = GraphedStep(model, lc, opt, amp_dtype, clip_grad_norm=1.0, record=record, warmup=0)
        losses[way] = []
        for b in batches:
            if way == "graphed":
                loss = step(b, step_norm([b], 1))
                sched.step()
            else:
                loss = train_step([b], model, lc, opt, sched, amp_dtype=amp_dtype, clip_grad_norm=1.0)[0]
            losses[way].append(loss.item())
        losses[way + " weights"] = [p.detach().float().sum().item() for p in model.parameters()]
    return losses


def test_the_graphed_step_is_train_step_on_static_tensors():
    """Off CUDA the GPU check's graphed mode runs its step eagerly on the static tensors it copies each batch into:
    the same losses and weights as train_step (what a recorded graph then replays)."""
    losses = graphed_against_train_step("cpu", record=False, amp_dtype=None)
    assert losses["graphed"] == losses["train_step"]
    assert losses["graphed weights"] == losses["train_step weights"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU (the CPU test above checks "
                    "the step the graph records)")
def test_the_graphed_step_replays_train_steps_losses_within_bf16_noise():
    losses = graphed_against_train_step("cuda", record=True, amp_dtype=torch.bfloat16)
    torch.testing.assert_close(torch.tensor(losses["graphed"][1:]), torch.tensor(losses["train_step"][1:]),
                               rtol=2e-2, atol=2e-2)
