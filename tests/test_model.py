"""The model: shapes, masks, parity with torch.nn.Transformer, attention retrieval, tied embeddings."""

import math

import pytest
import torch
from torch import nn

from annotated_transformer import Batch, PositionalEncoding, make_model, subsequent_mask
from annotated_transformer.fast import FusedAttention, swap_class
from annotated_transformer.model import MultiHeadedAttention, attention
from annotated_transformer.visualization import keep_attention


def tiny(**kw):
    torch.manual_seed(0)
    args = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.0)
    args.update(kw)
    return make_model(11, 13, **args)


def test_subsequent_mask_is_lower_triangular():
    m = subsequent_mask(5)
    assert m.shape == (1, 5, 5) and m.dtype == torch.bool
    for i in range(5):
        for j in range(5):
            assert bool(m[0, i, j]) == (j <= i)


def test_batch_masks_hide_padding_and_the_future():
    pad = 2
    src = torch.tensor([[0, 5, 6, 1], [0, 7, 1, pad]])
    tgt = torch.tensor([[0, 8, 9, 10, 1], [0, 8, 1, pad, pad]])
    b = Batch(src, tgt, pad=pad)
    assert b.src_mask.shape == (2, 1, 4)
    assert b.src_mask[1].tolist() == [[True, True, True, False]]
    assert torch.equal(b.tgt, tgt[:, :-1]) and torch.equal(b.tgt_y, tgt[:, 1:])
    assert b.tgt_mask.shape == (2, 4, 4)
    # row 1: positions 3 is padding, so nobody may attend to it; nobody sees the future
    assert b.tgt_mask[1].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, False],
    ]
    assert b.ntokens == 4 + 2 and isinstance(b.ntokens, int)


def test_output_shapes_and_log_probabilities():
    model = tiny()
    src = torch.randint(4, 11, (3, 7))
    tgt = torch.randint(4, 13, (3, 5))
    out = model(src, tgt, torch.ones(3, 1, 7, dtype=torch.bool), subsequent_mask(5))
    assert out.shape == (3, 5, 32)
    logp = model.generator(out)
    assert logp.shape == (3, 5, 13)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3, 5), atol=1e-5)


def test_padding_does_not_change_real_positions():
    model = tiny().eval()
    src = torch.randint(4, 11, (1, 6))
    tgt = torch.randint(4, 13, (1, 4))
    base = model(src, tgt, torch.ones(1, 1, 6, dtype=torch.bool), subsequent_mask(4))
    src_p = torch.cat([src, torch.full((1, 3), 2)], 1)
    mask_p = (src_p != 2).unsqueeze(-2)
    padded = model(src_p, tgt, mask_p, subsequent_mask(4))
    assert torch.allclose(base, padded, atol=1e-5)


def test_future_tokens_do_not_leak():
    model = tiny().eval()
    src = torch.randint(4, 11, (1, 6))
    smask = torch.ones(1, 1, 6, dtype=torch.bool)
    tgt = torch.randint(4, 13, (1, 5))
    a = model(src, tgt, smask, subsequent_mask(5))
    tgt2 = tgt.clone()
    tgt2[0, 3:] = 5  # change the future
    b = model(src, tgt2, smask, subsequent_mask(5))
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-4)


def test_positional_encoding_matches_the_formula():
    pe = PositionalEncoding(16, 0.0, max_len=50)
    x = torch.zeros(1, 50, 16)
    y = pe(x)[0]
    for pos in (0, 1, 17, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert y[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert y[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    with pytest.raises(ValueError, match=r"51 positions exceeds the positional table \(50\); raise model.max_pos"):
        pe(torch.zeros(1, 51, 16))


def test_embeddings_are_scaled_by_sqrt_d_model():
    model = tiny()
    emb = model.src_embed[0]
    ids = torch.tensor([[4, 5]])
    assert torch.allclose(emb(ids), emb.lut.weight[ids] * math.sqrt(32))


def test_xavier_initialisation_bounds():
    model = tiny()
    w = model.encoder.layers[0].feed_forward.w_1.weight  # (d_ff, d_model)
    bound = math.sqrt(6.0 / (32 + 64))
    assert w.abs().max() <= bound + 1e-6
    assert w.abs().max() > 0.8 * bound  # uniform over the whole range, not a narrower default init


def copy_into_torch_transformer(model, norm_first: bool, d_model: int, h: int, d_ff: int, N: int) -> nn.Transformer:
    ref = nn.Transformer(d_model, h, N, N, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first,
                         layer_norm_eps=1e-6)

    def copy_attn(dst: nn.MultiheadAttention, src) -> None:
        dst.in_proj_weight.data.copy_(torch.cat([src.linears[i].weight for i in range(3)], 0))
        dst.in_proj_bias.data.copy_(torch.cat([src.linears[i].bias for i in range(3)], 0))
        dst.out_proj.weight.data.copy_(src.linears[3].weight)
        dst.out_proj.bias.data.copy_(src.linears[3].bias)

    def copy_ln(dst: nn.LayerNorm, src) -> None:
        dst.weight.data.copy_(src.weight)
        dst.bias.data.copy_(src.bias)

    def copy_ff(dst, src) -> None:
        dst.linear1.weight.data.copy_(src.w_1.weight)
        dst.linear1.bias.data.copy_(src.w_1.bias)
        dst.linear2.weight.data.copy_(src.w_2.weight)
        dst.linear2.bias.data.copy_(src.w_2.bias)

    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
        copy_attn(theirs.self_attn, ours.self_attn)
        copy_ff(theirs, ours.feed_forward)
        copy_ln(theirs.norm1, ours.sublayer[0].norm)
        copy_ln(theirs.norm2, ours.sublayer[1].norm)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
        copy_attn(theirs.self_attn, ours.self_attn)
        copy_attn(theirs.multihead_attn, ours.src_attn)
        copy_ff(theirs, ours.feed_forward)
        copy_ln(theirs.norm1, ours.sublayer[0].norm)
        copy_ln(theirs.norm2, ours.sublayer[1].norm)
        copy_ln(theirs.norm3, ours.sublayer[2].norm)
    if norm_first:
        copy_ln(ref.encoder.norm, model.encoder.norm)
        copy_ln(ref.decoder.norm, model.decoder.norm)
    else:  # the paper's post-norm has no final LayerNorm after the stacks
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_matches_torch_nn_transformer_with_copied_weights(norm_first, fused):
    d_model, h, d_ff, N = 32, 4, 64, 2
    torch.manual_seed(3)
    model = make_model(11, 13, N=N, d_model=d_model, d_ff=d_ff, h=h, dropout=0.0, norm_first=norm_first)
    if fused:  # the speed plan's attention: PyTorch's fused kernel on the same weights
        swap_class(model, MultiHeadedAttention, FusedAttention)
    # non-trivial LayerNorm gains/biases, so a mix-up of norms would show
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    ref = copy_into_torch_transformer(model, norm_first, d_model, h, d_ff, N)
    model.train()  # dropout is 0; train mode keeps torch's encoder off its fused fast path
    ref.train()
    B, S, T, pad = 3, 7, 6, 2
    src = torch.randint(4, 11, (B, S))
    src[1, 5:] = pad
    src[2, 3:] = pad
    tgt = torch.randint(4, 13, (B, T))
    tgt[2, 4:] = pad
    batch = Batch(src, torch.cat([torch.zeros(B, 1, dtype=torch.long), tgt], 1), pad=pad)
    x_src = model.src_embed(src)
    x_tgt = model.tgt_embed(batch.tgt)
    ours = model.decoder(x_tgt, model.encoder(x_src, batch.src_mask), batch.src_mask, batch.tgt_mask)
    causal = ~subsequent_mask(T)[0]  # torch: True = may NOT attend
    theirs = ref(x_src, x_tgt, tgt_mask=causal, src_key_padding_mask=src == pad,
                 tgt_key_padding_mask=batch.tgt == pad, memory_key_padding_mask=src == pad)
    real = batch.tgt != pad
    assert torch.allclose(ours[real], theirs[real], atol=1e-5), (ours[real] - theirs[real]).abs().max()


def test_attention_probabilities_only_when_asked():
    model = tiny().eval()
    src = torch.randint(4, 11, (2, 5))
    src[1, 3:] = 2
    tgt = torch.randint(4, 13, (2, 4))
    b = Batch(src, tgt, pad=2)
    plain = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    attention = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    assert all(m.attn is None for m in attention)
    with keep_attention(model):
        kept = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    assert torch.allclose(plain, kept, atol=1e-5)  # the explicit path computes the same thing
    enc = model.encoder.layers[0].self_attn.attn
    self_ = model.decoder.layers[1].self_attn.attn
    src_ = model.decoder.layers[1].src_attn.attn
    assert enc.shape == (2, 4, 5, 5) and self_.shape == (2, 4, 3, 3) and src_.shape == (2, 4, 3, 5)
    for a in (enc, self_, src_):
        assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-5)
    assert torch.all(src_[1, :, :, 3:] == 0)  # padding receives no attention
    assert torch.all(self_.triu(1) == 0)  # no attention to the future
    # outside the block the hooks are gone and nothing new is stored
    model.encoder.layers[0].self_attn.attn = None
    model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    assert all(m.hooks == [] for m in attention) and model.encoder.layers[0].self_attn.attn is None


def test_attention_function_is_softmax_qk_v():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    out, p = attention(q, k, v)
    expected_p = torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1)
    assert torch.allclose(p, expected_p, atol=1e-6)
    assert torch.allclose(out, expected_p @ v, atol=1e-6)


def test_tied_embeddings_share_one_matrix():
    torch.manual_seed(0)
    model = make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    w = model.src_embed[0].lut.weight
    assert model.tgt_embed[0].lut.weight is w and model.generator.proj.weight is w
    untied = make_model(20, 20, N=1, d_model=16, d_ff=32, h=2)
    assert untied.num_parameters() - model.num_parameters() == 2 * 20 * 16
    with pytest.raises(ValueError, match="shared vocabulary"):
        make_model(20, 21, tie_embeddings=True)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_cpu_dropout_keeps_the_right_fraction_and_scales(p):
    from annotated_transformer.fast.dropout import FastDropout as Dropout

    d = Dropout(p).train()
    torch.manual_seed(0)
    x = torch.ones(1000, 1001, requires_grad=True)  # an odd count: the last 64-bit draw is only partly used
    y = d(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 3e-3
    for slot in range(4):  # every 16-bit word of the random integers is used and unbiased
        assert abs(kept.view(-1)[slot::4].float().mean().item() - (1 - p)) < 5e-3
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # the gradient passes through the kept elements, scaled alike
    torch.manual_seed(0)
    assert torch.equal(d(x), y)  # seeded: the same mask again
    assert torch.equal(d.eval()(x), x)  # evaluation: the identity
    assert d.train()(torch.ones(3, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("p, dtype", [(0.1, torch.bfloat16), (0.25, torch.float32), (0.5, torch.float32)])
def test_cpu_dropout_mask_is_the_documented_threshold_on_16_bit_words(p, dtype):
    """The integer-arithmetic mask keeps exactly the elements whose random word clears the threshold."""
    from annotated_transformer.fast.dropout import FastDropout as Dropout

    x = torch.randn(37, 53).to(dtype)
    torch.manual_seed(5)
    got = Dropout(p).train()(x)
    torch.manual_seed(5)  # the same draw, by the rule the docstring states
    bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2**63, None)
    words = bits.view(torch.int16)[:x.numel()].view(x.shape)
    expected = torch.where(words >= round(p * 65536) - 32768, x, 0.0) * (1.0 / (1.0 - p))
    assert got.dtype == dtype
    assert torch.equal(got, expected.to(dtype))
    assert 0 < int((got == 0).sum()) < x.numel()


def test_cpu_dropout_backward_scales_in_fp32_and_rounds_once():
    """The gradient is grad * keep * 1/(1-p) rounded once to bf16, not grad times a bf16-rounded scale."""
    from annotated_transformer.fast.dropout import FastDropout as Dropout

    torch.manual_seed(7)
    x = (torch.rand(41, 67) + 0.5).bfloat16().requires_grad_()  # no zeros: y == 0 marks a dropped element
    grad = torch.randn(41, 67).bfloat16()
    y = Dropout(0.1).train()(x)
    y.backward(grad)
    kept = y.detach() != 0
    expected = torch.where(kept, grad, 0.0) * (1.0 / 0.9)  # bf16 tensor times a Python float: fp32 math, one rounding
    assert torch.equal(x.grad, expected)
    assert not torch.equal(x.grad, torch.where(kept, grad, 0.0) * torch.tensor(1.0 / 0.9).bfloat16())


def _dropout_rates(model, cls):
    return {m.dropout.p for m in model.modules() if isinstance(m, cls)}


def test_attention_and_activation_dropout_set_apart_from_p_drop():
    from annotated_transformer.model import PositionwiseFeedForward, SublayerConnection

    apart = tiny(dropout=0.3, attention_dropout=0.0, activation_dropout=0.5)
    assert _dropout_rates(apart, MultiHeadedAttention) == {0.0}
    assert _dropout_rates(apart, PositionwiseFeedForward) == {0.5}
    assert _dropout_rates(apart, SublayerConnection) == {0.3} == _dropout_rates(apart, PositionalEncoding)
    default = tiny(dropout=0.3)  # off: every rate is model.dropout, as in the notebook
    for cls in (MultiHeadedAttention, PositionwiseFeedForward, SublayerConnection, PositionalEncoding):
        assert _dropout_rates(default, cls) == {0.3}

    src, tgt = torch.randint(1, 11, (3, 7)), torch.randint(1, 13, (3, 6))
    src_mask, tgt_mask = torch.ones(3, 1, 7, dtype=torch.bool), subsequent_mask(6)

    def forward(model, seed):
        torch.manual_seed(seed)
        return model.train()(src, tgt, src_mask, tgt_mask)

    same = tiny(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3)  # the default's rates, spelled out
    assert torch.equal(forward(default, 1), forward(same, 1))
    only_attention = tiny(attention_dropout=0.5)  # dropout 0 everywhere else: only attention draws masks
    assert not torch.allclose(forward(only_attention, 1), forward(only_attention, 2))
    assert torch.equal(forward(tiny(), 1), forward(tiny(), 2))


def test_dropout_rates_come_from_the_config_and_are_checked():
    from annotated_transformer.config import load_config
    from annotated_transformer.runtime.errors import ConfigError
    from annotated_transformer.extensions.builder import build_model
    from annotated_transformer.model import PositionwiseFeedForward

    cfg = load_config("tiny", ["model.dropout=0.2", "model.attention_dropout=0.0", "model.activation_dropout=0.1"])
    model = build_model(cfg, 30, 30)
    assert _dropout_rates(model, MultiHeadedAttention) == {0.0}
    assert _dropout_rates(model, PositionwiseFeedForward) == {0.1}
    assert load_config("tiny", []).model.attention_dropout is None
    for key in ("model.attention_dropout=1.0", "model.activation_dropout=-0.1"):
        with pytest.raises(ConfigError, match=key.split("=")[0]):
            load_config("tiny", [key])
