"""run_epoch: loss normalisation, gradient accumulation, scheduler stepping, TrainState."""

import copy

import pytest
import torch

from annotated_transformer import Batch, LabelSmoothing, SimpleLossCompute, TrainState, make_model, run_epoch
from annotated_transformer.harness.train_loop import LoopHooks, train_loop


def make_batch(rows: list[list[int]], pad: int = 2) -> Batch:
    width = max(len(r) for r in rows)
    t = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        t[i, : len(r)] = torch.tensor(r)
    return Batch(t, t.clone(), pad=pad)


def random_rows(g: torch.Generator, n: int, V: int) -> list[list[int]]:
    lengths = torch.randint(3, 9, (n,), generator=g).tolist()
    return [[0] + torch.randint(4, V, (L - 2,), generator=g).tolist() + [1] for L in lengths]


def setup(seed: int = 0):
    torch.manual_seed(seed)
    V = 12
    model = make_model(V, V, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    crit = LabelSmoothing(V, 2, 0.1)
    return model, SimpleLossCompute(model.generator, crit), crit


def sgd(model):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_gradient_accumulation_equals_one_big_batch():
    g = torch.Generator().manual_seed(0)
    groups = [random_rows(g, n, 12) for n in (3, 5, 2)]  # micro-batches of different sizes and lengths
    micro = [make_batch(rows) for rows in groups]
    big = [make_batch([r for rows in groups for r in rows])]
    assert len({b.ntokens for b in micro}) > 1

    model_a, lc_a, _ = setup()
    model_b = copy.deepcopy(model_a)
    lc_b = SimpleLossCompute(model_b.generator, lc_a.criterion)
    before = copy.deepcopy(model_a.state_dict())

    opt_a, sch_a = sgd(model_a)
    loss_a, st_a = run_epoch(micro, model_a, lc_a, opt_a, sch_a, accum_iter=3, log=None)
    opt_b, sch_b = sgd(model_b)
    loss_b, st_b = run_epoch(big, model_b, lc_b, opt_b, sch_b, accum_iter=1, log=None)

    assert st_a.step == st_b.step == 1 and st_a.micro_step == 3
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    moved = 0.0
    for name, p in model_a.state_dict().items():
        assert torch.allclose(p, model_b.state_dict()[name], atol=1e-6), name
        moved += (p - before[name]).abs().sum().item()
    assert moved > 1e-3  # the step did change the weights


def test_naive_accumulation_would_differ():
    """Guard the test above: averaging per-micro-batch means is NOT the big-batch gradient here."""
    g = torch.Generator().manual_seed(0)
    groups = [random_rows(g, n, 12) for n in (3, 5, 2)]
    model, lc, crit = setup()
    grads_sum_of_means = None
    for rows in groups:
        b = make_batch(rows)
        model.zero_grad()
        out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
        (lc(out, b.tgt_y, b.ntokens)[1] / len(groups)).backward()
        gr = [p.grad.clone() for p in model.parameters()]
        grads_sum_of_means = gr if grads_sum_of_means is None else [a + c for a, c in zip(grads_sum_of_means, gr)]
    big = make_batch([r for rows in groups for r in rows])
    model.zero_grad()
    out = model(big.src, big.tgt, big.src_mask, big.tgt_mask)
    lc(out, big.tgt_y, big.ntokens)[1].backward()
    diff = max((a - p.grad).abs().max().item() for a, p in zip(grads_sum_of_means, model.parameters()))
    assert diff > 1e-5


def test_scheduler_steps_once_per_optimizer_step():
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(random_rows(g, 4, 12)) for _ in range(7)]
    model, lc, _ = setup()
    opt, sch = sgd(model)
    _, st = run_epoch(batches, model, lc, opt, sch, accum_iter=3, log=None)
    # 7 micro-batches in groups of 3: steps of 3, 3 and a last short group of 1
    assert st.step == 3 and st.micro_step == 7
    assert sch.last_epoch == 3
    assert st.tokens == sum(b.ntokens for b in batches)
    assert st.samples == 28


def test_eval_returns_mean_loss_per_token_and_does_not_train():
    g = torch.Generator().manual_seed(2)
    batches = [make_batch(random_rows(g, 5, 12)) for _ in range(3)]
    model, lc, crit = setup()
    before = copy.deepcopy(model.state_dict())
    loss, st = run_epoch(batches, model, lc, mode="eval", log=None)
    total = sum(crit(model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask)).reshape(-1, 12),
                     b.tgt_y.reshape(-1)).item() for b in batches)
    assert loss == pytest.approx(total / sum(b.ntokens for b in batches), rel=1e-5)
    assert st.step == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_max_steps_and_should_stop():
    g = torch.Generator().manual_seed(3)
    batches = [make_batch(random_rows(g, 4, 12)) for _ in range(10)]
    model, lc, _ = setup()
    opt, sch = sgd(model)
    st = TrainState()
    train_loop(batches, model, lc, opt, sch, st, max_steps=4, hooks=LoopHooks(log=None))
    assert st.step == 4
    calls, st2 = [], TrainState()
    train_loop(batches, model, lc, opt, sch, st2,
               hooks=LoopHooks(log=None, should_stop=lambda: len(calls) >= 2 or calls.append(1)))
    assert st2.step == 3


def test_log_lines_report_step_loss_throughput_and_lr():
    g = torch.Generator().manual_seed(4)
    batches = [make_batch(random_rows(g, 4, 12)) for _ in range(4)]
    model, lc, _ = setup()
    opt, sch = sgd(model)
    lines, records = [], []
    train_loop(batches, model, lc, opt, sch, TrainState(), log_every=2,
               hooks=LoopHooks(log=lines.append, on_log=records.append))
    assert len(lines) == 2 and "step" in lines[0] and "tok/s" in lines[0] and "lr" in lines[0]
    assert [r["step"] for r in records] == [2, 4]
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 and r["lr"] == 1.0 for r in records)
    lines = []  # the notebook's run_epoch prints on steps 1, 41, 81, ... (every log_every)
    _, st = run_epoch(batches, model, lc, opt, sch, log_every=2, log=lines.append)
    assert st.step == 4 and len(lines) == 2 and lines[0].startswith("step      1 | loss ") and "lr 1.0e+00" in lines[0]


def test_train_state_has_no_shared_default():
    a, b = TrainState(), TrainState()
    a.step += 5
    assert b.step == 0
    model, lc, _ = setup()
    opt, sch = sgd(model)
    g = torch.Generator().manual_seed(5)
    batch = [make_batch(random_rows(g, 2, 12))]
    _, s1 = run_epoch(batch, model, lc, opt, sch, log=None)
    _, s2 = run_epoch(batch, model, lc, opt, sch, log=None)
    assert s1 is not s2 and s1.step == 1 and s2.step == 1
