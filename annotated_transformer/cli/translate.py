"""`translate --checkpoint PATH [TEXT]`: source-language text in, target-language text out, as people use a translator.

    translate --checkpoint runs/cpu_15min                              # a terminal: a prompt, an answer per line
    translate --checkpoint runs/cpu_15min "Ein Mann fährt Fahrrad."     # translate, exit
    translate --checkpoint runs/cpu_15min "Ein Mann fährt." "Zwei Kinder spielen."   # a line out per quoted sentence
    translate --checkpoint runs/cpu_15min Ein Mann fährt.                # words without quotes: one sentence
    translate --checkpoint runs/cpu_15min --beam 5 --n-best 3 "Ein Mann fährt."   # NUMBER<TAB>SCORE<TAB>TEXT lines
    translate --checkpoint runs/cpu_15min --input de.txt --out en.txt --beam 5   # again: add --overwrite
    cat de.txt | translate --checkpoint exported/cpu_45min > en.txt    # a pipe streams: a line out per line in

The model loads first, then the input is read: a prompt answers each line as it is typed, and a pipe
gets each answer as soon as its line has arrived (lines that arrive together are decoded together).
Output keeps the input's order and its empty lines. An --out file appears only once complete: an existing one
is replaced only with --overwrite (a killed run leaves it whole), and never when it is the --input file.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import queue
import sys
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, BinaryIO

from ..runtime.errors import DataError, UserError
from ..runtime.files import not_gzip, not_utf8
from .options import (CommandParser, add_batch_size, add_checkpoint, add_decoding, add_device, add_out, add_overwrite,
                      add_quantize, check_out_file, check_utf8_arguments, path_given)

LANGUAGES = {"de": "German", "en": "English"}
_END = object()  # the reader thread's last item


def build_parser(prog: str | None) -> CommandParser:
    """translate's options: the shared ones, the text to translate, and how to decode it."""
    parser = CommandParser(prog=prog, description="Translate sentences with a trained model: typed at a prompt, "
                           "given on the command line, or one per line from a file or a pipe.")
    add_checkpoint(parser)
    parser.add_argument("text", nargs="*", help="sentences to translate: quote each one (\"Ein Mann fährt.\" "
                        "\"Zwei Kinder spielen.\" gives two lines); words without quotes next to each other "
                        "(options between them aside) are one sentence up to a word ending in . ! ? or … (Ein Mann "
                        "fährt. is one; Hallo. Danke. are two); after --, words that start with - too")
    parser.add_argument("--sentence", action="append", metavar="TEXT", help=argparse.SUPPRESS)  # older spelling
    parser.add_argument("--input", default=None, metavar="FILE", type=path_given,
                        help="UTF-8 text, one sentence per line, plain or .gz ('-' for standard input; a pipe is read "
                        "without it)")
    add_out(parser, "write the translations to this file (default: standard output); an existing file is refused "
                    "unless --overwrite", old=())
    add_overwrite(parser, "replace an existing --out file (never the --input file)")
    add_decoding(parser)
    add_batch_size(parser)
    parser.add_argument("--n-best", type=int, default=None, metavar="N",
                        help="the N best translations of each sentence (N at most the beam), a line each: the "
                             "sentence's number, the score (the log-probability divided by the length penalty, "
                             "as the beam ranks them) and the translation, separated by tabs")
    add_device(parser)
    add_quantize(parser)
    return parser


# What ends a sentence: a word given after one of these starts the next sentence.
SENTENCE_ENDS = (".", "!", "?", "…", '."', '!"', '?"')


def sentences_of(arguments: Sequence[str]) -> list[str]:
    """The sentences given as arguments: one that holds a space (it was quoted) is a sentence of its own; words
    without spaces next to each other are joined into one (`translate Ein Mann fährt.` is one sentence) until a
    word that ends a sentence (`translate Hallo. Danke.` is two)."""
    sentences: list[str] = []
    words: list[str] = []
    for argument in arguments:
        if len(argument.split()) > 1:
            if words:
                sentences.append(" ".join(words))
                words = []
            sentences.append(argument)
        else:
            words.append(argument)
            if argument.endswith(SENTENCE_ENDS):
                sentences.append(" ".join(words))
                words = []
    return sentences + ([" ".join(words)] if words else [])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Load the model, then translate what was given, typed or piped."""
    args = build_parser(prog).parse_args(argv)
    given = [*(args.sentence or []), *sentences_of(args.text)]
    check_utf8_arguments(given)
    if given and args.input is not None:
        raise UserError("give sentences (as arguments or --sentence) or --input FILE, not both")
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.n_best is not None and args.n_best < 1:
        raise UserError(f"--n-best must be at least 1, got {args.n_best}")
    if args.out is not None:  # before the model loads: a refused output should cost nothing
        check_out_file(args.out, args.overwrite, {"--input": args.input, "--checkpoint": args.checkpoint})
    interactive = not given and args.input is None and sys.stdin.isatty()
    with opened_input(None if given or interactive else args.input or "-") as source:  # a bad path fails first
        if interactive:
            print("loading the model ...", file=sys.stderr, flush=True)
        translator = load(args)
        batch = args.batch_size or translator.config.decode.batch_size
        beam = args.beam or translator.config.decode.beam_size
        if args.n_best is not None and args.n_best > beam:
            raise UserError(f"--n-best {args.n_best} needs a beam at least as wide: add --beam {args.n_best} (the "
                            f"beam is {beam})")

        def decode(lines: list[str]) -> list[Any]:
            return translator.translate(lines, beam=beam, alpha=args.alpha, batch_size=batch, n_best=args.n_best)

        def work(out: IO[str]) -> None:
            if given:
                write_translations(translator, decode, given, 1, out, unit="sentence")
            elif interactive:
                prompt(translator, decode, out, describe(translator, args))
            else:
                number, name = 1, args.input if args.input not in (None, "-") else "standard input"
                for lines in read_batches(source, max_lines=8 * batch, name=name):
                    write_translations(translator, decode, lines, number, out)
                    number += len(lines)
                if number == 1:  # empty in, empty out, as for any filter; said, in case it was the wrong file
                    print(f"warning: {name} is empty: nothing to translate", file=sys.stderr)

        from ..deploy.text_translator import TruncationWarning

        with quiet_broken_pipe(), warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncationWarning)  # write_translations names each cut line instead
            write_output(args.out, work)
    return 0


def load(args: argparse.Namespace) -> Any:
    """The translator --checkpoint names, with the decoding options checked first."""
    from ..config import check_decode_options
    from ..deploy.translator import load_translator, set_token_reduction

    check_decode_options(args.beam, args.alpha)
    translator = load_translator(args.checkpoint, args.engine, args.device, args.quantize)
    set_token_reduction(translator, args.merge_ratio, args.prune_ratio)
    return translator


def describe(translator: Any, args: argparse.Namespace) -> str:
    """One line on what answers at the prompt: the weights, the languages, how it decodes."""
    cfg = translator.config
    where = getattr(translator, "checkpoint", None) or getattr(translator, "folder", "")
    beam = args.beam or cfg.decode.beam_size
    how = "greedy" if beam == 1 else f"beam {beam}"
    size = f"{translator.model.num_parameters() / 1e6:.1f}M parameters, " if hasattr(translator, "model") else ""
    return f"{where}: {size}{cfg.data.src_lang}->{cfg.data.tgt_lang}, {how}"


def write_translations(translator: Any, decode: Callable[[list[str]], list[Any]], lines: list[str], first: int,
                       out: IO[str], unit: str = "line") -> None:
    """Translate `lines` (numbered from `first`) and write one output line each, flushed; with --n-best, a line
    NUMBER<TAB>SCORE<TAB>TRANSLATION for each hypothesis. `unit` names what a number counts in a warning ("line" of
    the input, or "sentence" of the arguments)."""
    for number, line in enumerate(lines, first):
        if line.strip() and translator.source_ids(line)[1]:
            print(f"warning: {unit} {number} is longer than the model's limit of {translator.text.max_sentence_len} "
                  "tokens and was truncated", file=sys.stderr)
    for number, result in enumerate(decode(lines), first):
        if isinstance(result, str):
            out.write(result + "\n")
        else:  # the n best, best first
            out.write("".join(f"{number}\t{h.score:.4f}\t{h.text}\n" for h in result))
    out.flush()


def prompt(translator: Any, decode: Callable[[list[str]], list[Any]], out: IO[str], description: str) -> None:
    """Answer each typed line until Ctrl-D (or Ctrl-C) at the prompt."""
    try:
        import readline  # noqa: F401  (imported for its effect: line editing and history in input())
    except ImportError:  # not on every platform; the prompt works without it
        pass
    src = translator.config.data.src_lang
    print(f"{description}\nType a {LANGUAGES.get(src, src)} sentence and press Enter; Ctrl-D quits.",
          file=sys.stderr, flush=True)
    number = 0
    while True:
        try:
            line = input(f"{src}> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        number += 1
        if line.strip():
            write_translations(translator, decode, [line], number, out)


def read_batches(stream: BinaryIO, max_lines: int, name: str) -> Iterator[list[str]]:
    """The lines of a UTF-8 byte stream, in batches of whatever has arrived (at most `max_lines`).

    A thread reads while the model decodes: a file arrives in full batches, and a pipe fed one line
    at a time gets each answer before its next line comes. A line that is not UTF-8 is one DataError,
    raised after the lines before it have been answered.
    """
    lines: queue.Queue = queue.Queue(maxsize=2 * max_lines)

    def read() -> None:
        try:
            for number, raw in enumerate(stream, 1):
                lines.put(decode_line(raw, number, name))
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:  # a damaged or cut .gz file
            lines.put(DataError(not_gzip(name, exc)))
        except (UserError, OSError) as exc:
            lines.put(exc)
        lines.put(_END)

    threading.Thread(target=read, name="translate-input", daemon=True).start()
    while True:
        batch: list[str] = []
        item = lines.get()
        while item is not _END and not isinstance(item, Exception):
            batch.append(item)
            if len(batch) == max_lines:
                break
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
        if batch:
            yield batch
        if isinstance(item, OSError):
            raise UserError(f"cannot read {name}: {item.strerror or item}")
        if isinstance(item, Exception):
            raise item
        if item is _END:
            return


def decode_line(raw: bytes, number: int, name: str) -> str:
    """One input line without its line ending; a line that is not UTF-8 is one DataError."""
    if number == 1:  # the byte-order mark some editors write first in a UTF-8 file: not part of the sentence
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(not_utf8(name, number, raw[exc.start])) from None


@contextmanager
def quiet_broken_pipe() -> Iterator[None]:
    """A reader that stops early (`translate ... | head`) ends the run quietly, as it does for other filters."""
    try:
        yield
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush


@contextmanager
def opened_input(path: str | None) -> Iterator[BinaryIO | None]:
    """The input as bytes: standard input for '-', a file, or nothing (None) when there is none to read."""
    if path is None:
        yield None
    elif path == "-":
        yield sys.stdin.buffer
    else:
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
        with f:
            if not path.endswith(".gz"):
                yield f
                return
            with gzip.GzipFile(fileobj=f, mode="rb") as unpacked:  # as evaluate and training read .gz files
                yield unpacked


def write_output(path: str | None, work: Callable[[IO[str]], None]) -> None:
    """Run `work` on standard output, or on a file that appears only once complete (`atomic_write`: an
    interrupted run leaves the old file whole, and no half file beside it)."""
    from ..runtime.files import atomic_write

    if path is None:
        work(sys.stdout)
        return

    def write(f: BinaryIO) -> None:
        text = io.TextIOWrapper(f, encoding="utf-8")
        try:
            work(text)
            text.flush()
        finally:
            text.detach()  # atomic_write closes the file itself, after syncing it

    try:
        atomic_write(path, write, follow_link=True)  # a link you named as --out: its file gets the translations
    except OSError as exc:  # a full disk while writing, say: the one line, and the old file kept
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; check the folder exists and is writable, "
                        "or choose another --out") from None
