"""benchmark --profile: a training step's time by kind of work."""

from __future__ import annotations

import pytest

from annotated_transformer.lab.step_profile import KINDS, _kind, format_profile, profile_training_step


@pytest.mark.parametrize("name, ancestors, kind", [
    ("aten::mm", ["aten::linear", "forward"], "matmul"),
    ("aten::addmm", ["autograd::engine::evaluate_function: AddmmBackward0", "backward"], "matmul"),
    ("aten::bmm", ["aten::_scaled_dot_product_attention_math", "forward"], "attention"),
    ("aten::mul", ["autograd::engine::evaluate_function: SoftmaxBackward0", "backward"], "attention"),
    ("aten::_fused_adam_", ["Optimizer.step#Adam.step", "optimizer"], "optimizer"),
    ("aten::exp_", ["_SmoothedCrossEntropy", "loss"], "loss"),
    ("aten::mm", ["aten::linear", "loss"], "matmul"),  # the output projection is a matrix product, not the loss
    ("aten::where", ["forward"], "elementwise"),
    ("aten::native_layer_norm_backward", ["backward"], "elementwise"),
])
def test_each_operator_is_counted_under_one_kind(name, ancestors, kind):
    assert _kind(name, ancestors) == kind


@pytest.mark.slow
def test_a_profile_accounts_for_the_whole_step(tiny_config):
    result = profile_training_step(tiny_config(), steps=2, warmup=1, log=None)
    ms, share = result["ms"], result["share"]
    assert list(ms) == list(KINDS)
    assert sum(ms.values()) == pytest.approx(result["step_ms"], rel=0.02)  # overhead is the rest of the wall time
    assert sum(share.values()) == pytest.approx(1.0, rel=0.02)
    assert all(ms[k] > 0 for k in ("matmul", "attention", "elementwise", "loss", "optimizer"))
    table = format_profile(result)
    assert table.splitlines()[2] == "| kind | ms/step | share |" and "| matmul |" in table
