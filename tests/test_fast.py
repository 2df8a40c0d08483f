"""fast/: the speed plan, installed on the notebook's classes from outside, and the same results with it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from annotated_transformer.attention import MultiHeadedAttention
from annotated_transformer.config import load_config
from annotated_transformer.data.batch import Batch
from annotated_transformer.decode.beam_search import beam_search
from annotated_transformer.decode.inference import translate_ids
from annotated_transformer.decode.query_grid import grouped_queries
from annotated_transformer.extensions.builder import build_training
from annotated_transformer.fast import (FastDropout, FusedAttention, FusedLossCompute, fused_adam_pays,
                                        speed_up_training, swap_class)
from annotated_transformer.loop import train_step
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute
from annotated_transformer.masks import padding_mask, subsequent_mask
from annotated_transformer.model import make_model
from annotated_transformer.optim import build_optimizer, rate
from annotated_transformer.runtime.errors import ConfigError

V, PAD = 40, 2


def small_model(dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    return make_model(23, 23, N=2, d_model=32, d_ff=64, h=4, dropout=dropout, tie_embeddings=True)


def batch() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 23, (3, 7), generator=g), torch.randint(3, 23, (3, 6), generator=g)
    src[0, 5:] = 0
    return src, tgt, padding_mask(src, 0), subsequent_mask(tgt.size(1)).expand(3, -1, -1)


def plain_parts(model: nn.Module) -> tuple[SimpleLossCompute, torch.optim.Adam]:
    """The notebook's loss and optimizer for `model`."""
    return SimpleLossCompute(model.generator, LabelSmoothing(23, 0, 0.1)), build_optimizer(model)


def test_the_training_plan_swaps_the_notebooks_classes_on_the_same_weights():
    model = small_model()
    kinds = {type(m) for m in model.modules()}
    assert {nn.Dropout, MultiHeadedAttention} <= kinds and not {FastDropout, FusedAttention} & kinds
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dropouts = [m for m in model.modules() if type(m) is nn.Dropout]
    attention = [m for m in model.modules() if type(m) is MultiHeadedAttention]
    loss_compute, optimizer = plain_parts(model)
    step_model, loss_fast, optimizer_fast = speed_up_training(model, loss_compute, optimizer, attention_kernel="fused")
    assert step_model is model  # train.compile=false: nothing wraps it
    assert all(type(m) is FastDropout for m in dropouts) and all(type(m) is FusedAttention for m in attention)
    assert type(loss_fast) is FusedLossCompute and loss_fast.criterion is loss_compute.criterion
    assert optimizer_fast.defaults["fused"] and not optimizer.defaults["fused"]
    assert [p for g in optimizer_fast.param_groups for p in g["params"]] == list(model.parameters())
    assert {k: v for k, v in optimizer_fast.defaults.items() if k not in ("fused", "foreach")} == {
        k: v for k, v in optimizer.defaults.items() if k not in ("fused", "foreach")}
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)


def test_train_fast_false_gives_back_the_notebooks_parts_untouched():
    model = small_model()
    loss_compute, optimizer = plain_parts(model)
    assert speed_up_training(model, loss_compute, optimizer, fast=False, attention_kernel="fused", compile=True) == (
        model, loss_compute, optimizer)
    assert {type(m) for m in model.modules()} & {FastDropout, FusedAttention} == set()


@pytest.mark.parametrize("kernel, fused", [("auto", False), ("explicit", False), ("fused", True)])
def test_model_attention_kernel_picks_the_kernel_training_runs_on_the_cpu(kernel, fused):
    model = small_model()
    speed_up_training(model, *plain_parts(model), attention_kernel=kernel)
    assert {type(layer.self_attn) for layer in model.encoder.layers} == {FusedAttention if fused
                                                                       else MultiHeadedAttention}


@pytest.mark.parametrize("dropout, mode", [(0.0, "train"), (0.3, "eval")])
def test_outputs_and_gradients_are_the_same_with_speed_on_and_off(dropout, mode):
    """Where no random mask is drawn, the installed speed changes nothing: outputs, loss and every gradient."""
    results = []
    for fast in (False, True):
        model = small_model(dropout)
        getattr(model, mode)()
        _, loss_compute, _ = speed_up_training(model, *plain_parts(model), fast=fast)
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


def random_batches(n: int = 3) -> list[Batch]:
    g = torch.Generator().manual_seed(5)
    out = []
    for length in range(6, 6 + n):
        src, tgt = torch.randint(4, V, (4, length), generator=g), torch.randint(4, V, (4, length + 1), generator=g)
        src[0, -2:], tgt[1, -3:] = PAD, PAD
        out.append(Batch(src, tgt, pad=PAD))
    return out


def train_steps(model: nn.Module, step_model: nn.Module, loss_compute: SimpleLossCompute,
                optimizer: torch.optim.Optimizer, d_model: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A few `train_step`s under the paper's schedule: the losses and the weights after them."""
    scheduler = LambdaLR(optimizer, lambda step: rate(step, d_model, 1.0, 10))
    model.train()
    losses = [train_step([b], step_model, loss_compute, optimizer, scheduler)[0].item() for b in random_batches()]
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def built(*overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """build_training's parts for the tiny config with `overrides`, stepped as the Trainer steps them."""
    cfg = load_config("tiny", ["train.precision=fp32", *overrides])
    torch.manual_seed(cfg.train.seed)
    model, loss_compute, _, optimizer, _, step_model, _ = build_training(cfg, V, V, PAD, torch.device("cpu"))
    return train_steps(model, step_model, loss_compute, optimizer, cfg.model.d_model)


def core_alone(*overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same steps on the core's classes alone: make_model, SimpleLossCompute, PyTorch's plain Adam."""
    cfg = load_config("tiny", list(overrides))
    m = cfg.model
    torch.manual_seed(cfg.train.seed)
    model = make_model(V, V, N=m.N, d_model=m.d_model, d_ff=m.d_ff, h=m.h, dropout=m.dropout)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, cfg.train.label_smoothing))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    return train_steps(model, model, loss_compute, optimizer, m.d_model)


def test_train_fast_false_trains_bit_for_bit_as_the_core_alone():
    """train.fast=false is the notebook's exact path: dropout masks drawn alike, the same sums, the same updates."""
    losses, weights = built("train.fast=false")
    core_losses, core_weights = core_alone()
    assert losses == core_losses
    assert weights.keys() == core_weights.keys() and all(torch.equal(weights[k], core_weights[k]) for k in weights)


@pytest.mark.parametrize("kernel", ["auto", "fused"])
def test_train_fast_true_gives_the_core_losses_within_float_rounding(kernel):
    """With dropout 0 (the CPU mask draws differently from nn.Dropout), the speed plan changes only the order of
    fp32 sums: the fused loss's, fused Adam's update, the fused attention kernel's. Each is off by a few units in
    the last place (1e-7 relative; 1e-5 leaves room for other CPUs' kernels), in the losses and in the weights
    taken together. Not element by element: Adam divides each gradient by its own magnitude, so a weight whose
    gradient is rounding noise moves a whole learning-rate step whichever way the noise points. W^K's bias is
    such a weight (its exact gradient is 0: it shifts every score of a row alike, which the softmax ignores)."""
    losses, weights = built("model.dropout=0", f"model.attention_kernel={kernel}")
    core_losses, core_weights = core_alone("model.dropout=0")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(core_losses), rtol=1e-5, atol=0)
    learned = [k for k in weights if not k.endswith("attn.linears.1.bias")]
    ours, core = (torch.cat([w[k].flatten() for k in learned]) for w in (weights, core_weights))
    assert (ours - core).norm() <= 1e-5 * core.norm()


@pytest.mark.parametrize("setting, message", [
    ("train.compile=true", "train.fast=false runs the notebook's exact path, without torch.compile: drop "
                           "train.compile=true or set train.fast=true"),
    ("model.attention_kernel=fused", "train.fast=false runs the notebook's explicit attention: drop "
                                     "model.attention_kernel=fused or set train.fast=true"),
])
def test_train_fast_false_refuses_the_speed_settings_it_would_ignore(setting, message):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", ["train.fast=false", setting])
    assert str(err.value) == message
    assert load_config("tiny", ["train.fast=false", "model.attention_kernel=explicit"]).train.fast is False


class Probe:
    """An attention hook that asks for the probabilities when `want` and records what it was handed."""

    def __init__(self, want: bool) -> None:
        self.want, self.seen = want, []

    def needs_probs(self, attn) -> bool:
        return self.want

    def __call__(self, attn, keys, probs) -> None:
        self.seen.append(None if probs is None else tuple(probs.shape))


def test_the_fused_kernel_hands_a_hook_the_probabilities_it_asks_for(monkeypatch):
    model = small_model(dropout=0.0).eval()
    swap_class(model, MultiHeadedAttention, FusedAttention)
    src, tgt, src_mask, tgt_mask = batch()
    asks, not_asking = Probe(True), Probe(False)
    model.decoder.layers[0].src_attn.hooks.append(asks)
    model.decoder.layers[1].src_attn.hooks.append(not_asking)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model(src, tgt, src_mask, tgt_mask)
    assert asks.seen == [(3, 4, 6, 7)] and not_asking.seen == [None]  # (B, h, T, S) explicitly; none from the kernel
    assert len(calls) == 5  # 6 attentions (2 encoder layers, 2 decoder layers of 2), all but the one that asked


def test_the_decoding_plan_swaps_in_the_fused_kernel_only_while_it_decodes(monkeypatch):
    model = small_model(dropout=0.0)
    sources = [[1, 5, 6, 7, 2], [1, 8, 9, 2]]
    common = dict(pad=0, bos=1, eos=2, device=torch.device("cpu"), max_len_a=4)
    seen: list[set[type]] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append({type(m) for m in model.modules() if isinstance(m, MultiHeadedAttention)})
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    translate_ids(model, sources, attention_kernel="auto", **common)
    translate_ids(model, sources, attention_kernel="fused", fast=False, **common)
    assert seen == []  # auto is explicit on the CPU; fast=False leaves the notebook's attention
    translate_ids(model, sources, attention_kernel="fused", **common)
    assert seen and all(kinds == {FusedAttention} for kinds in seen)
    assert {type(m) for m in model.modules() if isinstance(m, MultiHeadedAttention)} == {MultiHeadedAttention}
    assert model.training  # given back in the mode it came in


def test_the_fast_dropout_draws_a_mask_of_the_same_rate_as_pytorchs():
    torch.manual_seed(2)
    x = torch.ones(200, 500)
    kept = {cls: (cls(0.3).train()(x) != 0).float().mean().item() for cls in (nn.Dropout, FastDropout)}
    assert abs(kept[nn.Dropout] - 0.7) < 0.01 and abs(kept[FastDropout] - 0.7) < 0.01


def test_training_builds_the_speed_in():
    model, loss_compute, _, optimizer, _, step_model, _ = build_training(load_config("tiny"), 50, 50, 2,
                                                                         torch.device("cpu"))
    assert type(loss_compute) is FusedLossCompute and loss_compute.fused and step_model is model
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
    model = small_model()
    assert not build_optimizer(model).defaults["fused"]
    assert build_optimizer(model, fused=fused_adam_pays(model)).defaults["fused"]


def test_train_compile_takes_false_true_or_captured_and_captured_needs_a_gpu(tiny_config, tmp_path, train_command):
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
    from annotated_transformer.harness.schedules import build_scheduler

    g = torch.Generator().manual_seed(3)
    shapes = [(4, 7), (6, 5), (4, 7), (6, 5), (4, 7), (6, 5)]  # two shapes, each recorded once and replayed
    batches = [Batch(torch.randint(3, 23, (b, n), generator=g), torch.randint(3, 23, (b, n + 1), generator=g), pad=0)
               for b, n in shapes]
    losses = {}
    for mode in (False, "captured"):
        model = small_model(dropout=0.0).cuda()
        step_model, lc, opt = speed_up_training(model, *plain_parts(model), compile=mode)
        sched = build_scheduler(opt, 32, 1.0, 10, lr_on_device=mode == "captured")  # as the Trainer builds them
        assert opt.defaults["fused"] and {type(m) for m in model.modules()} >= {FusedAttention, FastDropout}
        losses[mode] = [train_step([b.to("cuda")], step_model, lc, opt, sched, amp_dtype=torch.bfloat16,
                                   clip_grad_norm=1.0)[0].item() for b in batches]
    torch.testing.assert_close(torch.tensor(losses["captured"]), torch.tensor(losses[False]), rtol=2e-2, atol=2e-2)


def graphed_against_train_step(device: str, record: bool, amp_dtype: torch.dtype | None) -> dict[str, list[float]]:
    """Six steps over two batch shapes, by train_step and by the GPU check's GraphedStep, from the same weights."""
    from annotated_transformer.harness.schedules import build_scheduler
    from annotated_transformer.lab.graphed_step import GraphedStep
    from annotated_transformer.loop import step_norm

    g = torch.Generator().manual_seed(4)
    shapes = [(4, 7), (6, 5), (4, 7), (6, 5), (4, 7), (6, 5)]
    batches = [Batch(torch.randint(3, 23, (b, n), generator=g), torch.randint(3, 23, (b, n + 1), generator=g),
                     pad=0).to(device) for b, n in shapes]
    losses = {}
    for way in ("train_step", "graphed"):
        torch.manual_seed(0)
        model = small_model(dropout=0.0).to(device)
        _, lc, opt = speed_up_training(model, *plain_parts(model))
        sched = build_scheduler(opt, 32, 1.0, 10, lr_on_device=True)
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
