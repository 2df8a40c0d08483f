"""The Transformer of "Attention Is All You Need", with the notebook's names, top to bottom.

Shapes: B batch, S source length, T target length, d = d_model, h heads, d_k = d / h, V vocabulary
size. Masks are boolean with True = "may attend": `src_mask` (B, 1, S), `tgt_mask` (B, T, T).
`norm_first` puts LayerNorm before each sublayer (the notebook, with a final LayerNorm after each stack)
or after the residual sum (the paper, Section 3.1). Speed (`fast/`), incremental decoding with a
key/value cache (`decode/`) and the extensions (`extensions/`) work on these classes from outside.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadedAttention, attention  # noqa: F401 - equation 1 and Section 3.2.2
from .masks import subsequent_mask  # noqa: F401 - the decoder's mask, public here as in the notebook


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """N independent deep copies of `module`."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.LayerNorm):
    """Layer normalisation (Ba et al. 2016) with the biased variance inside the root (the notebook's: docs/model.md)."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__(features, eps=eps)


# --------------------------------------------------------------------------- sublayers


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2), applied at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, L, d) -> (B, L, d)."""
        return self.w_2(self.dropout(self.w_1(x).relu()))  # (B, L, d_ff) inside


class SublayerConnection(nn.Module):
    """A residual connection around a sublayer, with LayerNorm before (pre-norm) or after (post-norm)."""

    def __init__(self, size: int, dropout: float, norm_first: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = LayerNorm(size, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        """(B, L, d) -> (B, L, d)."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each wrapped in a SublayerConnection."""

    def __init__(self, size: int, self_attn: MultiHeadedAttention, feed_forward: PositionwiseFeedForward,
                 dropout: float, norm_first: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first, eps), 2)
        self.size = size

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, d), mask (B, 1, S) -> (B, S, d)."""
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    """A stack of N EncoderLayers (plus a final LayerNorm in pre-norm mode)."""

    def __init__(self, layer: EncoderLayer, N: int, norm_first: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size, eps=eps) if norm_first else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, d), mask (B, 1, S) -> memory (B, S, d)."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention over the memory, then feed-forward."""

    def __init__(self, size: int, self_attn: MultiHeadedAttention, src_attn: MultiHeadedAttention,
                 feed_forward: PositionwiseFeedForward, dropout: float, norm_first: bool = True,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first, eps), 3)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """x (B, T, d), memory (B, S, d), src_mask (B, 1, S), tgt_mask (B, T, T) -> (B, T, d)."""
        m = memory
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, src_mask))  # keys/values: the memory
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """A stack of N DecoderLayers (plus a final LayerNorm in pre-norm mode)."""

    def __init__(self, layer: DecoderLayer, N: int, norm_first: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size, eps=eps) if norm_first else nn.Identity()

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """x (B, T, d), memory (B, S, d) -> (B, T, d)."""
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


# --------------------------------------------------------------------------- embeddings and output


class Embeddings(nn.Module):
    """Token embeddings scaled by sqrt(d_model) (Section 3.4)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        """(B, L) token ids -> (B, L, d)."""
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    """Adds PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Section 3.5), then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
        div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
        # Derived, not learned: kept out of checkpoints.
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)  # (1, max_len, d)

    def forward(self, x: Tensor) -> Tensor:
        """(B, L, d) -> (B, L, d)."""
        if x.size(1) > self.pe.size(1):
            raise ValueError(f"sequence of {x.size(1)} positions exceeds the positional table "
                             f"({self.pe.size(1)}); raise model.max_positions")
        return self.dropout(x + self.pe[:, : x.size(1)])


class Generator(nn.Module):
    """The final linear projection to the vocabulary, followed by log-softmax."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: Tensor) -> Tensor:
        """(..., d) -> log-probabilities (..., V)."""
        return F.log_softmax(self.logits(x), dim=-1)

    def logits(self, x: Tensor) -> Tensor:
        """(..., d) -> unnormalised scores (..., V), for a loss that fuses the log-softmax."""
        return self.proj(x)


class EncoderDecoder(nn.Module):
    """The standard encoder-decoder architecture: encode the source once, decode the target against it."""

    def __init__(self, encoder: Encoder, decoder: Decoder, src_embed: nn.Sequential,
                 tgt_embed: nn.Sequential, generator: Generator) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed  # Sequential(Embeddings, PositionalEncoding)
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        """src (B, S), tgt (B, T), masks -> decoder output (B, T, d); apply `generator` for log-probs."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) -> memory (B, S, d)."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor) -> Tensor:
        """memory (B, S, d), tgt (B, T) -> (B, T, d)."""
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)

    def encode_memory(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """The memory and the mask the decoders read it with: `encode`'s and `src_mask`, unless a subclass's
        encoder shortens the memory."""
        return self.encode(src, src_mask), src_mask

    def num_parameters(self) -> int:
        """Distinct parameters (a tied matrix counts once), trainable or frozen (a Translator's model is frozen)."""
        return sum(p.numel() for p in self.parameters())


def make_model(src_vocab: int, tgt_vocab: int, N: int = 6, d_model: int = 512, d_ff: int = 2048, h: int = 8,
               dropout: float = 0.1, norm_first: bool = True, tie_embeddings: bool = False,
               max_positions: int = 5000, layer_norm_eps: float = 1e-6, N_dec: int | None = None,
               attention_dropout: float | None = None, activation_dropout: float | None = None) -> EncoderDecoder:
    """Build the Transformer from hyper-parameters, with Xavier-uniform initialisation of every matrix.

    `N_dec` decoder layers (default N); `dropout` is P_drop (Section 5.4), also on the attention
    probabilities and after the FFN's ReLU unless `attention_dropout` / `activation_dropout` say otherwise.
    `tie_embeddings` shares one (V, d) matrix between both embeddings and the generator (Section 3.4).
    """
    if tie_embeddings and src_vocab != tgt_vocab:
        raise ValueError(f"tied embeddings need one shared vocabulary, got {src_vocab} and {tgt_vocab}")
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout if attention_dropout is None else attention_dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout if activation_dropout is None else activation_dropout)
    position = PositionalEncoding(d_model, dropout, max_positions)
    eps = layer_norm_eps
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm_first, eps), N, norm_first, eps),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm_first, eps), N_dec or N, norm_first, eps),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    if tie_embeddings:
        shared = model.src_embed[0].lut.weight
        model.tgt_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    return model

