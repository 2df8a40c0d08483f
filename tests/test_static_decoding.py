"""Validation on fixed shapes: greedy search with preallocated key/value buffers and a step that compiles once per
shape (decode/static.py), and validation batches from the static plan; the same tokens and losses as the dynamic
ones."""

from __future__ import annotations

import json
import math

import pytest
import torch

from annotated_transformer import make_model
from annotated_transformer.data.buckets import width_ladder
from annotated_transformer.decode import static as static_decoding
from annotated_transformer.decode.incremental import greedy_search
from annotated_transformer.decode.inference import translate_ids
from annotated_transformer.decode.static import static_greedy_search, static_step, validation_step
from annotated_transformer.extensions.local_attention import with_local_attention
from annotated_transformer.extensions.token_merging import with_token_merging
from annotated_transformer.harness.train_loop import evaluate_loss
from annotated_transformer.loss import LabelSmoothing, SimpleLossCompute

BOS, EOS, PAD = 0, 1, 2


def random_model(seed: int, V: int = 15, norm_first: bool = True):
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first).eval()
    with torch.no_grad():  # </s> likely enough that sentences end at different lengths
        model.generator.proj.bias[EOS] += 1.5
    return model


def random_sources(seed: int, B: int, V: int = 15) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (B,), generator=g).tolist()
    return [[BOS, *torch.randint(4, V, (n - 2,), generator=g).tolist(), EOS] for n in lengths]


def padded(sources: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.full((len(sources), max(map(len, sources))), PAD)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
    return src, (src != PAD).unsqueeze(-2)


@pytest.mark.parametrize("B", [1, 7, 32])
@pytest.mark.parametrize("norm_first", [True, False])
def test_fixed_shapes_give_greedy_searchs_tokens(B, norm_first):
    for seed in range(3):
        model = random_model(seed, norm_first=norm_first)
        sources = random_sources(seed, B)
        src, mask = padded(sources)
        limits = torch.tensor([len(s) + 6 for s in sources])  # per-sentence limits
        limits[0] = 1  # a limit of 1: the start symbol alone
        dynamic = greedy_search(model, src, mask, limits, BOS, EOS, PAD)
        fixed = static_greedy_search(model, src, mask, limits, BOS, EOS, PAD, length=int(limits.max()) + 5)
        assert torch.equal(fixed, dynamic), seed


def test_fixed_shapes_read_a_merged_memory_alike():
    model = with_token_merging(random_model(4), 0.4, layers=(0,))
    src, mask = padded(random_sources(4, 9))
    assert torch.equal(static_greedy_search(model, src, mask, 14, BOS, EOS, PAD, length=16),
                       greedy_search(model, src, mask, 14, BOS, EOS, PAD))


def test_without_end_symbol_the_rows_past_their_limit_match_too():
    model = random_model(5)
    src, mask = padded(random_sources(5, 4))
    limits = torch.tensor([3, 9, 5, 9])
    fixed = static_greedy_search(model, src, mask, limits, BOS)
    assert torch.equal(fixed, greedy_search(model, src, mask, limits, BOS))


@pytest.mark.slow
def test_one_graph_serves_every_position_of_a_shape():
    """The compiled step sees the position as a tensor: one capture for a whole search, and for the next batch of
    the same shape; fullgraph=True, so no graph breaks (what CUDA graphs need)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    step = torch.compile(static_step, backend=backend, fullgraph=True, dynamic=False)
    model = random_model(6)
    for seed in (6, 7):
        src = padded(random_sources(seed, 8))[0]
        src = torch.nn.functional.pad(src, (0, 12 - src.size(1)), value=PAD)  # (8, 12): one shape for both
        mask = (src != PAD).unsqueeze(-2)
        compiled = static_greedy_search(model, src, mask, 14, BOS, EOS, PAD, length=14, step=step)
        assert torch.equal(compiled, greedy_search(model, src, mask, 14, BOS, EOS, PAD))
    assert len(graphs) == 1
    # the search's buffers went with it: only on CUDA are they kept (one set a shape, for a captured graph)
    assert model not in static_decoding._KEPT
    torch._dynamo.reset()


def test_translate_ids_pads_every_batch_to_a_fixed_shape(monkeypatch):
    model = random_model(8)
    sources = random_sources(8, 21)
    shapes = []
    search = static_decoding.static_greedy_search

    def record(model, src, src_mask, max_len, *args, length=None, **kwargs):
        shapes.append((src.size(0), src.size(1), length))
        return search(model, src, src_mask, max_len, *args, length=length, **kwargs)

    monkeypatch.setattr("annotated_transformer.decode.inference.static_greedy_search", record)
    kwargs = dict(pad=PAD, bos=BOS, eos=EOS, device=torch.device("cpu"), max_len_a=5, batch_size=8)
    fixed = translate_ids(model, sources, static=static_step, **kwargs)
    assert fixed == translate_ids(model, sources, **kwargs)
    ladder = set(width_ladder(64).tolist())
    assert len(shapes) == math.ceil(21 / 8) and all(rows == 8 for rows, _, _ in shapes)  # filler rows fill the last
    assert all(width in ladder and length in ladder for _, width, length in shapes)
    shapes.clear()
    assert translate_ids(model, sources, static=static_step, beam_size=2, **kwargs) == \
        translate_ids(model, sources, beam_size=2, **kwargs)
    local = with_local_attention(model, 2)
    assert translate_ids(local, sources, static=static_step, **kwargs) == translate_ids(local, sources, **kwargs)
    assert shapes == []  # beam search and local attention's band decode on the shapes they meet
    src, mask = padded(sources[:2])
    with pytest.raises(ValueError, match="no step mask for local attention"):
        static_greedy_search(local, src, mask, 9, BOS, EOS, PAD)
    kwargs["batch_size"] = 64
    translate_ids(model, sources, static=static_step, **kwargs)
    assert [rows for rows, _, _ in shapes] == [32]  # 21 sentences: padded to the next power of two, not to 64


def test_validation_step_follows_train_compile(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled.append(kwargs["mode"]) or (fn, kwargs["mode"]))
    static_decoding.compiled_step.cache_clear()
    try:
        cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
        assert validation_step(False, gpu) is None  # not compiled, on a GPU: the search on the shapes it meets
        assert validation_step(False, cpu) is static_step  # on the CPU: fixed shapes, a few oneDNN kernels
        assert validation_step(True, cpu) == (static_step, None) and validation_step(True, gpu) is \
            validation_step(True, cpu)
        assert validation_step("captured", gpu) == (static_step, "reduce-overhead")
        assert compiled == [None, "reduce-overhead"]  # compiled once per process and mode
    finally:
        static_decoding.compiled_step.cache_clear()


@pytest.mark.slow
def test_static_validation_batches_give_the_same_loss_in_a_few_shapes(multi30k_data):
    dynamic = multi30k_data.eval_batches("val")
    fixed = multi30k_data.eval_batches("val", static=True)
    shapes = {tuple(b.src.shape) for b in fixed}
    assert all(b.tgt.shape == (b.src.size(0), b.src.size(1) - 1) for b in fixed)  # one width for both sides
    assert len(shapes) <= len(width_ladder(int(max(b.src.size(1) for b in fixed))))
    assert sum(b.ntokens for b in fixed) == sum(b.ntokens for b in dynamic)  # every target token once
    assert sorted(tuple(r[r != PAD].tolist()) for b in fixed for r in b.src if r[1] != PAD) == \
        sorted(tuple(r[r != PAD].tolist()) for b in dynamic for r in b.src)  # every sentence once; fillers aside
    V = len(multi30k_data.text.tgt_vocab)
    torch.manual_seed(0)
    model = make_model(len(multi30k_data.text.src_vocab), V, N=1, d_model=32, d_ff=64, h=4)
    loss = SimpleLossCompute(model.generator, LabelSmoothing(V, multi30k_data.text.pad_id, 0.1))
    assert evaluate_loss(fixed, model, loss) == pytest.approx(evaluate_loss(dynamic, model, loss), rel=1e-5)


@pytest.mark.slow
def test_a_run_with_static_shapes_validates_on_them(tiny_config, tmp_path, monkeypatch, train_command, no_charts):
    """data.static_shapes=true on the CPU (auto turns it on for CUDA runs): the val loss batches and the val BLEU
    search, during the run and at its end, take the fixed shapes (uncompiled, static_step on the CPU), and the run
    records both."""
    searched, loss_batches = [], []
    search = static_decoding.static_greedy_search
    monkeypatch.setattr("annotated_transformer.decode.inference.static_greedy_search",
                        lambda *a, **k: searched.append(a[1].shape) or search(*a, **k))
    evaluate = evaluate_loss

    def evaluating(batches, *args, **kwargs):
        loss_batches.extend(tuple(b.src.shape) for b in batches)
        return evaluate(batches, *args, **kwargs)

    monkeypatch.setattr("annotated_transformer.harness.trainer.evaluate_loss", evaluating)
    code, _, err = train_command("--config", "tiny", f"data.root={tiny_config().data.root}",
                                 f"data.cache_dir={tiny_config().data.cache_dir}", f"train.out_dir={tmp_path}",
                                 "train.max_steps=4", "train.device=cpu", "train.precision=fp32",
                                 "data.static_shapes=true", "train.bleu_every=1", "decode.max_len_a=4",
                                 "train.score_test=false", "train.progress=false")
    assert code == 0, err[-2000:]
    records = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
               if r.get("kind") == "epoch"]
    assert records and "bleu" in records[-1] and math.isfinite(records[-1]["val_loss"])
    rows = {static_decoding.static_rows(n, tiny_config().decode.batch_size) for n in range(1, 1015)}
    batches = math.ceil(1014 / tiny_config().decode.batch_size)
    assert len(searched) == 2 * batches  # the epoch's val BLEU, then the final one on the chosen weights
    assert all(shape[0] in rows and shape[1] in set(width_ladder(256).tolist()) for shape in searched)
    assert len(set(loss_batches)) <= len(width_ladder(256))  # a few shapes
    assert " static shapes | " in (tmp_path / "train.log").read_text()  # the first line says how many
