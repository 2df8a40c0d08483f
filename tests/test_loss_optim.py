"""LabelSmoothing against its definition, SimpleLossCompute, and the Noam `rate`."""

import pytest
import torch

from annotated_transformer import Generator, LabelSmoothing, SimpleLossCompute, rate
from annotated_transformer.fast import FusedLossCompute
from annotated_transformer.fast import loss as fused_loss
from annotated_transformer.fast.loss import smoothed_cross_entropy
from annotated_transformer.harness.schedules import build_scheduler
from annotated_transformer.optim import build_optimizer


def explicit_kl(x: torch.Tensor, target: torch.Tensor, size: int, pad: int, smoothing: float) -> torch.Tensor:
    """The textbook construction: build the smoothed distribution, then sum t * (log t - x) where t > 0."""
    t = torch.full_like(x, smoothing / (size - 2))
    t.scatter_(1, target.unsqueeze(1), 1.0 - smoothing)
    t[:, pad] = 0
    t[target == pad] = 0
    pos = t > 0
    return (t[pos] * (t[pos].log() - x[pos])).sum()


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
def test_label_smoothing_equals_explicit_kl_divergence(smoothing):
    torch.manual_seed(0)
    V, pad = 13, 2
    x = torch.randn(40, V).log_softmax(-1)
    target = torch.randint(0, V, (40,))
    target[::7] = pad
    crit = LabelSmoothing(V, pad, smoothing)
    assert torch.allclose(crit(x, target), explicit_kl(x, target, V, pad, smoothing), rtol=1e-5, atol=1e-5)
    # and against torch's own KLDivLoss on the same target distribution
    t = crit.smoothed_targets(target)
    ref = torch.nn.KLDivLoss(reduction="sum")(x, t)
    assert torch.allclose(crit(x, target), ref, rtol=1e-5, atol=1e-5)


def test_gradient_matches_explicit_kl():
    torch.manual_seed(1)
    V, pad = 9, 0
    logits = torch.randn(16, V, requires_grad=True)
    target = torch.randint(1, V, (16,))
    LabelSmoothing(V, pad, 0.2)(logits.log_softmax(-1), target).backward()
    g1 = logits.grad.clone()
    logits.grad = None
    explicit_kl(logits.log_softmax(-1), target, V, pad, 0.2).backward()
    assert torch.allclose(g1, logits.grad, atol=1e-6)


def test_smoothed_targets_match_the_notebook_definition():
    crit = LabelSmoothing(5, 0, 0.4)
    dist = crit.smoothed_targets(torch.tensor([2, 1, 0, 3, 3]))
    expected_row0 = torch.tensor([0.0, 0.4 / 3, 0.6, 0.4 / 3, 0.4 / 3])
    assert torch.allclose(dist[0], expected_row0)
    assert torch.all(dist[2] == 0)  # a padding target contributes nothing
    assert torch.allclose(dist[[0, 1, 3, 4]].sum(1), torch.ones(4))


def test_simple_loss_compute_returns_sum_and_normalised():
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(8, 7), torch.nn.LogSoftmax(-1))
    crit = LabelSmoothing(7, 2, 0.1)
    x, y = torch.randn(3, 5, 8), torch.randint(0, 7, (3, 5))
    total, normed = SimpleLossCompute(gen, crit)(x, y, 4.0)
    assert torch.allclose(total, crit(gen(x).reshape(-1, 7), y.reshape(-1)))
    assert torch.allclose(normed, total / 4.0)
    assert not total.requires_grad and normed.requires_grad


def test_rate_follows_the_paper_formula():
    d, w = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 20000):
        expected = d ** -0.5 * min(step ** -0.5, step * w ** -1.5)
        assert rate(step, d, 1.0, w) == pytest.approx(expected)
    assert rate(0, d, 1.0, w) == rate(1, d, 1.0, w)  # step 0 counts as 1
    assert rate(100, d, 2.0, w) == pytest.approx(2 * rate(100, d, 1.0, w))
    peak = max(range(1, 20000, 7), key=lambda s: rate(s, d, 1.0, w))
    assert abs(peak - w) <= 7


def test_scheduler_drives_adam_with_the_paper_betas():
    model = torch.nn.Linear(4, 4)
    opt = build_optimizer(model)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = build_scheduler(opt, 64, 1.0, 10)
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(rate(1, 64, 1.0, 10))
    assert lrs[5] == pytest.approx(rate(5, 64, 1.0, 10))
    assert lrs[25] == pytest.approx(rate(25, 64, 1.0, 10))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
def test_fused_from_logits_matches_log_softmax_then_divergence(smoothing, monkeypatch):
    # Small chunks so the row loop runs several times, with a ragged last chunk.
    monkeypatch.setattr(fused_loss, "_CPU_CHUNK_ELEMENTS", 5 * 13)
    torch.manual_seed(3)
    V, pad = 13, 2
    logits = (3 * torch.randn(41, V)).requires_grad_()
    target = torch.randint(0, V, (41,))
    target[::6] = pad
    crit = LabelSmoothing(V, pad, smoothing)
    fused = smoothed_cross_entropy(logits, target, crit)
    (2.5 * fused).backward()
    g_fused = logits.grad.clone()
    logits.grad = None
    plain = crit(logits.log_softmax(-1), target)
    (2.5 * plain).backward()
    assert torch.allclose(fused, plain, rtol=1e-5, atol=1e-5)
    assert torch.allclose(g_fused, logits.grad, atol=1e-6)
    assert torch.all(g_fused[target == pad] == 0)  # padding rows get no gradient


def test_fused_loss_on_large_bf16_logits_matches_the_fp32_reference(monkeypatch):
    # Logits in the thousands: exp overflows unless each row is shifted by its maximum, and the backward
    # pass rebuilds the softmax from the log-sum-exp the forward pass kept, shift included.
    monkeypatch.setattr(fused_loss, "_CPU_CHUNK_ELEMENTS", 3 * 17)
    torch.manual_seed(6)
    V, pad = 17, 0
    logits = (2000 * torch.randn(10, V)).bfloat16().requires_grad_()
    target = torch.randint(1, V, (10,))
    target[4] = pad
    crit = LabelSmoothing(V, pad, 0.1)
    (0.25 * smoothed_cross_entropy(logits, target, crit)).backward()
    reference = logits.detach().float().requires_grad_()
    expected = crit(reference.log_softmax(-1), target)
    (0.25 * expected).backward()
    assert torch.isfinite(logits.grad.float()).all()
    assert torch.allclose(smoothed_cross_entropy(logits.detach(), target, crit), expected, rtol=1e-5)
    assert torch.allclose(logits.grad.float(), reference.grad, atol=2e-3)
    assert logits.grad.dtype == torch.bfloat16


def test_fused_loss_keeps_only_the_logits_between_the_passes():
    crit = LabelSmoothing(50, 0, 0.1)
    logits = torch.randn(30, 50, requires_grad=True)
    loss = smoothed_cross_entropy(logits, torch.randint(0, 50, (30,)), crit)
    saved = loss.grad_fn.saved_tensors
    big = [t for t in saved if t.numel() >= logits.numel()]
    assert len(big) == 1 and big[0].data_ptr() == logits.data_ptr()  # the logits themselves, no (N, V) gradient


def test_fused_loss_compute_matches_unfused_in_bf16():
    torch.manual_seed(4)
    gen = Generator(16, 50)
    crit = LabelSmoothing(50, 0, 0.1)
    x, y = torch.randn(4, 9, 16), torch.randint(0, 50, (4, 9))
    results = []
    for fused in (True, False):
        gen.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            total, normed = (FusedLossCompute if fused else SimpleLossCompute)(gen, crit)(x, y, 7.0)
        normed.backward()
        results.append((total, gen.proj.weight.grad.clone()))
    (t_f, g_f), (t_u, g_u) = results
    assert FusedLossCompute(gen, crit).fused and not FusedLossCompute(gen, torch.nn.KLDivLoss()).fused
    # CPU autocast runs the unfused log-softmax in bf16; the fused path works in fp32.
    assert t_f.dtype == torch.float32
    assert torch.allclose(t_f, t_u.float(), rtol=1e-2)
    assert torch.allclose(g_f, g_u, rtol=2e-2, atol=2e-3)


def test_fused_loss_in_eval_keeps_no_gradient_and_gives_the_same_value():
    torch.manual_seed(5)
    crit = LabelSmoothing(11, 1, 0.1)
    logits, target = torch.randn(20, 11), torch.randint(0, 11, (20,))
    with torch.no_grad():
        value = smoothed_cross_entropy(logits, target, crit)
    assert not value.requires_grad
    assert torch.allclose(value, crit(logits.log_softmax(-1), target), atol=1e-5)
