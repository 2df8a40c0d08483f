"""The options every command spells the same way: --checkpoint, --out, --quantize, --limit, --device.

Older spellings (--model, --output, --quantization, --sentences) still parse, under the new name,
and are left out of --help so that a reader learns one vocabulary.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

CHECKPOINT_HELP = ("a run directory (the weights its final scores used), a .pt file written by training or "
                   "averaging, or a folder written by the export command (CTranslate2)")


def _old_spelling(parser: argparse.ArgumentParser, old: Sequence[str], dest: str, **kwargs) -> None:
    """Accept `old` option names for `dest` without showing them in --help."""
    if old:
        parser.add_argument(*old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_checkpoint(parser: argparse.ArgumentParser, required: bool = True, help: str = CHECKPOINT_HELP) -> None:
    """--checkpoint PATH (old spelling: --model, which named an exported folder)."""
    parser.add_argument("--checkpoint", required=False, default=None, metavar="PATH", help=help)
    _old_spelling(parser, ["--model"], "checkpoint")
    if required:
        parser.set_defaults(_required_checkpoint=True)


def add_out(parser: argparse.ArgumentParser, help: str, required: bool = False, default: str | None = None,
            old: Sequence[str] = ("--output",)) -> None:
    """--out PATH (old spelling: --output)."""
    parser.add_argument("--out", default=default, metavar="PATH", help=help)
    _old_spelling(parser, old, "out")
    if required:
        parser.set_defaults(_required_out=True)


def add_quantize(parser: argparse.ArgumentParser, choices: Sequence[str], default: str, help: str) -> None:
    """--quantize TYPE (old spelling: --quantization)."""
    parser.add_argument("--quantize", default=default, choices=list(choices), help=help)
    _old_spelling(parser, ["--quantization"], "quantize", choices=list(choices))


def add_decoder_quantize(parser: argparse.ArgumentParser) -> None:
    """--quantize for the commands that decode (translate, evaluate): our decoder as trained, int8 or bf16 weights."""
    add_quantize(parser, ("none", "int8", "bf16"), "none", "int8: PyTorch's dynamic int8 quantisation of the linear "
                 "layers (CPU); bf16: bf16 weights, on hardware with native bf16 (see docs/deployment.md)")


def add_limit(parser: argparse.ArgumentParser, help: str) -> None:
    """--limit N (old spelling: --sentences)."""
    parser.add_argument("--limit", type=int, default=None, metavar="N", help=help)
    _old_spelling(parser, ["--sentences"], "limit", type=int)


def add_device(parser: argparse.ArgumentParser, help: str = "cpu, cuda, cuda:N or mps (default: the best available)"
               ) -> None:
    """--device NAME."""
    parser.add_argument("--device", default=None, help=help)


def add_decoding(parser: argparse.ArgumentParser) -> None:
    """--beam, --alpha and the token-reduction ratios: how translate and evaluate decode."""
    parser.add_argument("--beam", type=int, default=None, help="beam width (default: the checkpoint's decode.beam_size)")
    parser.add_argument("--alpha", type=float, default=None, help="length-penalty exponent for beam search")
    parser.add_argument("--engine", default=None, choices=["torch", "ctranslate2"],
                        help="which decoder (default: follows from --checkpoint: ctranslate2 for an exported folder)")
    parser.add_argument("--merge-ratio", type=float, default=None, metavar="R",
                        help="token merging at inference: merge this fraction of each source sentence's tokens in "
                             "every merging encoder layer (0-0.5; default: as the checkpoint was trained)")
    parser.add_argument("--prune-ratio", type=float, default=None, metavar="R",
                        help="token pruning at inference: drop this fraction of each source sentence's tokens, the "
                             "least attended, in every merging encoder layer (0-0.5)")


def check_required(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The required shared options, checked after parsing so that an old spelling counts too."""
    for name in ("checkpoint", "out"):
        if getattr(args, f"_required_{name}", False) and getattr(args, name, None) is None:
            parser.error(f"the following arguments are required: --{name}")
    return args
