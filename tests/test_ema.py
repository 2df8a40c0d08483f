"""The exponential moving average of the weights (extensions/ema.py): its arithmetic, the swap, and a run that
validates, saves and resumes the average."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from annotated_transformer.config import load_config
from annotated_transformer.runtime.errors import ConfigError
from annotated_transformer.extensions.ema import WeightAverage, build_weight_average
from annotated_transformer.checkpoints import load_checkpoint
from annotated_transformer.harness.distributed import DistInfo
from annotated_transformer.harness.run_dir import RunDir
from annotated_transformer.harness.trainer import Trainer, train_worker
from annotated_transformer.harness.train_loop import evaluate_loss
from annotated_transformer.model import make_model

QUIET = ["train.progress=false", "train.device=cpu", "train.log_every=1"]


def test_the_average_follows_the_formula_with_its_early_decay():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    ema = build_weight_average(0.5, model, optimizer)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 20):
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        decay = min(0.5, (1 + n) / (10 + n))  # 2/11 at the first update, 0.5 from the 8th on
        expected = [decay * e + (1 - decay) * p.detach() for e, p in zip(expected, model.parameters())]
        assert ema.updates == n
    assert [torch.allclose(a, e, atol=1e-6) for a, e in zip(ema.average, expected)] == [True, True]
    assert not torch.allclose(ema.average[0], model.weight)  # an average, not the last weights


def test_swapped_in_holds_the_average_then_the_raw_weights_bit_for_bit_with_tied_embeddings():
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    ema = WeightAverage(model, 0.99)
    assert sum(p is model.generator.proj.weight for p in ema.params) == 1  # the tied matrix averaged once
    assert len(ema.params) == len(list(model.named_parameters(remove_duplicate=False))) - 2  # 3 names, 1 matrix
    for a in ema.average:
        a.add_(1.0)
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped_in():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), ema.average))
        assert torch.equal(model.tgt_embed[0].lut.weight, raw["tgt_embed.0.lut.weight"] + 1)
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items())
    with pytest.raises(RuntimeError, match="inside"), ema.swapped_in():
        raise RuntimeError("inside")
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items())  # restored on an exception too
    averaged = ema.averaged_state_dict(model)
    assert averaged.keys() == raw.keys()
    assert all(torch.equal(averaged[k], raw[k] + 1) for k in raw if raw[k].is_floating_point()
               and k.endswith(("weight", "bias")))


def test_off_installs_nothing():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    assert build_weight_average(0.0, model, optimizer) is None
    assert not optimizer._optimizer_step_post_hooks
    build_weight_average(0.5, model, optimizer)
    assert len(optimizer._optimizer_step_post_hooks) == 1


def test_a_saved_average_of_another_model_is_refused():
    ema = WeightAverage(nn.Linear(2, 2), 0.9)
    with pytest.raises(ValueError, match=r"tensor 0 has shape \(2, 3\), the model's parameter \(2, 2\)"):
        ema.load_state_dict(WeightAverage(nn.Linear(3, 2), 0.9).state_dict())
    with pytest.raises(ValueError, match="holds 1 tensors, the model 2 parameters"):
        ema.load_state_dict(WeightAverage(nn.Linear(2, 2, bias=False), 0.9).state_dict())


@pytest.mark.parametrize("decay", ["1.0", "-0.1"])
def test_a_decay_outside_0_to_1_is_a_config_error(decay):
    with pytest.raises(ConfigError, match=r"ema.decay must be in \[0, 1\)"):
        load_config("copy", [f"ema.decay={decay}"])


def _copy_run(out, *extra: str):
    return load_config("copy", [f"train.out_dir={out}", "train.epochs=2", "data.copy_batches=6",
                                "data.copy_batch_size=16", "model.dropout=0.1", "ema.decay=0.9", *QUIET, *extra])


@pytest.mark.slow  # about a second on 2 cores: the fast tier stays under a minute
def test_validation_scores_the_average_and_the_saved_weights_are_it(tmp_path, no_charts):
    cfg = _copy_run(tmp_path / "r", "train.epochs=1", "train.accum_steps=2", "model.tie_embeddings=true")
    run = RunDir(cfg.run_dir())
    run.open(cfg, DistInfo())
    trainer = Trainer(cfg, DistInfo(), torch.device("cpu"), run)
    trainer.fit()  # finish() loads best.pt (epoch 1) into the model
    run.unlock()
    record = next(json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
                  if json.loads(x)["kind"] == "epoch")
    last = load_checkpoint(tmp_path / "r" / "last.pt")
    assert last["ema"]["updates"] == last["train_state"]["step"] == 3  # once per optimizer step, not per batch
    averaged = dict(zip([n for n, _ in trainer.model.named_parameters()], last["ema"]["average"]))
    for name in ("epoch_01.pt", "best.pt"):
        saved = load_checkpoint(tmp_path / "r" / name)["model"]
        assert all(torch.equal(saved[k], a) for k, a in averaged.items())
        assert torch.equal(saved["generator.proj.weight"], saved["src_embed.0.lut.weight"])  # tied alike
    assert not torch.equal(last["model"]["src_embed.0.lut.weight"], averaged["src_embed.0.lut.weight"])  # raw
    val = evaluate_loss(trainer.val_batches, trainer.model, trainer.loss_compute, device=torch.device("cpu"),
                        amp_dtype=trainer.amp_dtype)
    assert val == pytest.approx(record["val_loss"], rel=1e-6)


@pytest.mark.slow  # over a second on 2 cores: the fast tier stays under a minute
def test_a_run_stopped_mid_epoch_resumes_the_average_exactly(tmp_path, no_charts):
    train_worker(_copy_run(tmp_path / "whole"))
    train_worker(_copy_run(tmp_path / "parts", "train.max_steps=3"))  # stops inside epoch 1
    assert load_checkpoint(tmp_path / "parts" / "last.pt")["ema"]["updates"] == 3
    train_worker(_copy_run(tmp_path / "parts"))  # train.resume=auto continues it
    whole, parts = (load_checkpoint(tmp_path / run / "last.pt") for run in ("whole", "parts"))
    assert parts["ema"]["updates"] == whole["ema"]["updates"] == 12
    assert all(torch.equal(a, b) for a, b in zip(parts["ema"]["average"], whole["ema"]["average"]))
    best = (load_checkpoint(tmp_path / run / "best.pt")["model"] for run in ("whole", "parts"))
    assert all(torch.equal(a, b) for a, b in zip(*(m.values() for m in best)))


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_switched_off_at_a_resume_the_average_is_dropped_with_a_line_that_says_so(tmp_path, no_charts, capsys):
    train_worker(_copy_run(tmp_path / "r", "train.epochs=1", "train.max_steps=3"))
    train_worker(_copy_run(tmp_path / "r", "train.epochs=1", "ema.decay=0"))
    assert "holds a weight average that ema.decay=0 drops" in capsys.readouterr().out
    assert "ema" not in load_checkpoint(tmp_path / "r" / "last.pt")


@pytest.mark.slow  # over half a second on 2 cores: the fast tier stays under a minute
def test_switched_on_at_a_resume_the_average_starts_from_the_restored_weights(tmp_path, no_charts):
    train_worker(_copy_run(tmp_path / "r", "train.epochs=1", "train.max_steps=3", "ema.decay=0"))
    assert "ema" not in load_checkpoint(tmp_path / "r" / "last.pt")
    train_worker(_copy_run(tmp_path / "r", "train.epochs=1"))
    assert load_checkpoint(tmp_path / "r" / "last.pt")["ema"]["updates"] == 3  # the steps since the resume
