"""CPU kernel choices: oneDNN fp32 linears while decoding (fast/cpu_linear.py), explicit attention on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from annotated_transformer.fast import cpu_linear
from annotated_transformer.attention import MultiHeadedAttention
from annotated_transformer.fast.cpu_linear import ENV, MIN_MACS, OneDNNLinear, onednn_available, onednn_linears
from annotated_transformer.fast.attention import FusedAttention
from annotated_transformer.fast.plan import speed_up_decoding, swap_class
from annotated_transformer.decode.inference import translate_ids
from annotated_transformer.model import make_model

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN linear")


def ops_called(fn) -> set[str]:
    """The names of the operators `fn()` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@needs_onednn
def test_onednn_linear_matches_mkl_and_runs_in_onednn_for_large_products():
    torch.manual_seed(0)
    lin = nn.Linear(256, 1024)
    x = torch.randn(2, 40, 256)  # 80 rows x 256 x 1024 multiply-adds: above MIN_MACS
    assert x.numel() * lin.out_features >= MIN_MACS
    expected = lin(x)
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        assert type(lin) is OneDNNLinear
        got = lin(x)
        names = ops_called(lambda: lin(x))
    assert "mkldnn::_linear_pointwise" in names
    assert got.shape == (2, 40, 1024)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert type(lin) is nn.Linear  # swapped back


@needs_onednn
def test_onednn_linear_leaves_small_products_training_and_autocast_to_mkl():
    lin = nn.Linear(256, 256)
    small = torch.randn(1, 256)  # one decoding row: oneDNN's fixed cost would be larger
    large = torch.randn(64, 256)
    with onednn_linears(lin, enabled=True):
        with torch.no_grad():
            assert "mkldnn::_linear_pointwise" not in ops_called(lambda: lin(small))
        y = lin(large)  # gradients on: training keeps F.linear (oneDNN's op has no backward here)
        assert torch.equal(y, F.linear(large, lin.weight, lin.bias))
        y.sum().backward()
        assert lin.weight.grad is not None
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert lin(large).dtype == torch.bfloat16  # autocast's own bf16 kernel, not the fp32 one


def test_onednn_linears_restores_the_classes_after_an_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="boom"):
        with onednn_linears(model, enabled=True):
            assert [type(m) for m in model] == [OneDNNLinear, nn.ReLU, OneDNNLinear]
            raise RuntimeError("boom")
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
    with onednn_linears(model, enabled=False):
        assert type(model[0]) is nn.Linear


def test_environment_variable_forces_the_choice(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.delenv(ENV, raising=False)
    assert not cpu_linear.onednn_pays()  # Intel: MKL stays
    monkeypatch.setattr(cpu_linear, "_cpu_vendor", lambda: "AuthenticAMD")
    assert cpu_linear.onednn_pays() == onednn_available()
    monkeypatch.setenv(ENV, "0")
    assert not cpu_linear.onednn_pays()
    monkeypatch.setattr(cpu_linear, "_cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setenv(ENV, "1")
    assert cpu_linear.onednn_pays() == onednn_available()


@pytest.mark.slow
@needs_onednn
def test_decoding_with_onednn_gives_the_same_translations(monkeypatch):
    torch.manual_seed(3)
    model = make_model(40, 40, N=2, d_model=64, d_ff=256, h=4, dropout=0.0).eval()
    sources = [[1] + torch.randint(4, 40, (n,)).tolist() + [2] for n in (3, 9, 17, 30, 12, 25)]
    common = dict(pad=0, bos=1, eos=2, device=torch.device("cpu"), max_len_a=10, batch_size=4)
    monkeypatch.setenv(ENV, "0")
    plain = translate_ids(model, sources, **common)
    beam_plain = translate_ids(model, sources, beam_size=3, **common)
    monkeypatch.setenv(ENV, "1")
    names = ops_called(lambda: translate_ids(model, sources, **common))
    assert "mkldnn::_linear_pointwise" in names
    assert translate_ids(model, sources, **common) == plain
    assert translate_ids(model, sources, beam_size=3, **common) == beam_plain
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("kernel, calls_fused_kernel", [("auto", False), ("fused", True), ("explicit", False)])
def test_attention_kernel_auto_is_explicit_on_the_cpu(monkeypatch, kernel, calls_fused_kernel):
    """model.attention_kernel through the decoding plan on the CPU: auto and explicit keep the paper's explicit
    equation 1 (faster here), fused swaps in PyTorch's kernel; the same outputs either way."""
    torch.manual_seed(0)
    attn = MultiHeadedAttention(4, 32, dropout=0.1)
    x, mask = torch.randn(2, 5, 32), torch.ones(2, 1, 5, dtype=torch.bool)
    attn.eval()
    other = copy.deepcopy(attn)  # the other kernel on the same weights: what each path must agree with
    if not calls_fused_kernel:
        swap_class(other, MultiHeadedAttention, FusedAttention)
    expected = other(x, x, x, mask)  # before the counting patch
    calls = []
    real = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    with speed_up_decoding(attn, torch.device("cpu"), attention_kernel=kernel):
        for mode in (attn.train, attn.eval):
            mode()
            attn(x, x, x, mask).sum()
        got = attn(x, x, x, mask)
    assert bool(calls) == calls_fused_kernel and type(attn) is MultiHeadedAttention
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@needs_onednn
@pytest.mark.parametrize("change", ["in_place", "fused_adam", "load_state_dict"])
def test_reordered_weight_follows_a_changed_weight(change):
    """Validation decodes between optimizer steps: a stale reordered weight would score old weights (fused Adam
    updates the weights without bumping their version counter, so no cache keyed on it would see the change)."""
    torch.manual_seed(1)
    lin = nn.Linear(256, 1024)
    x = torch.randn(64, 256)
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        before = lin(x)
    if change == "in_place":
        with torch.no_grad():
            lin.weight.mul_(0.5)
    elif change == "fused_adam":
        opt = torch.optim.Adam(lin.parameters(), lr=0.1, fused=True)
        lin(x).square().sum().backward()
        opt.step()
    else:
        lin.load_state_dict(nn.Linear(256, 1024).state_dict())
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        after = lin(x)
    assert lin not in cpu_linear._reordered  # a trainable weight's copy is dropped on leaving the block
    expected = F.linear(x, lin.weight, lin.bias).detach()
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


@needs_onednn
def test_a_frozen_weight_keeps_its_reordered_copy_until_it_changes():
    """The Translator's frozen model reorders each weight once, not once per translate call."""
    lin = nn.Linear(256, 1024).requires_grad_(False)
    x = torch.randn(64, 256)
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        lin(x)
    kept = cpu_linear._reordered[lin][1]
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        lin(x)
    assert cpu_linear._reordered[lin][1] is kept
    lin.load_state_dict(nn.Linear(256, 1024).state_dict())  # new weights: in place, a new version
    with torch.no_grad(), onednn_linears(lin, enabled=True):
        got = lin(x)
    assert cpu_linear._reordered[lin][1] is not kept
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
