"""The options every command spells the same way (--checkpoint, --out, --overwrite, --quantize, --limit,
--device, --beam, --batch-size), and `CommandParser`, the parser every command uses: its mistakes are one line each.

Older spellings (--model, --output, --quantization, --sentences, export's --force, the benchmark's --warmup) still
parse: `CommandParser` reads them under the new name before parsing, so --help and the usage lines teach one
vocabulary.

A list is one word, its items separated by commas (`--layers 1,3`, `--seed-list 1,2,3`): one word cannot swallow
the sentence or the overrides that follow it. The older space-separated spelling (`--layers 1 3`) still parses: the
words after the option that are items of its list are read as one comma-separated word (`CommandParser.add_list`).

Every command that writes a file follows one rule (`check_out_file`): it never writes over what it reads, and it
replaces an existing output only with --overwrite, atomically (a killed command leaves the old file whole).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..runtime.errors import fail
from ..runtime.files import refuse_to_replace, same_file

CHECKPOINT_HELP = ("a run directory (the weights its final scores used), a model file written by training or "
                   "averaging (.safetensors; or an older .pt), or a folder written by the export "
                   "command (CTranslate2)")
# --quantize: one vocabulary in every command; export maps it onto CTranslate2's weight types.
QUANTIZE = ("none", "int8", "bf16")
QUANTIZE_HELP = ("none (the weights as trained), int8 (int8 weights) or bf16 (bf16 weights); see "
                 "docs/deployment.md")


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose every mistake is one line with its fix: an unknown option names the nearest one
    (or, named like a config key, the `section.key=value` override that sets it), and old option spellings are
    read under their new names."""

    def __init__(self, *args: Any, takes_overrides: bool | frozenset[str] = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old_spellings: dict[str, str] = {}
        self.lists: dict[str, CommaList] = {}  # list option -> its type (add_list)
        self.given: list[str] = []  # the arguments parse_args was given, for error()
        # Which dotted overrides the command takes: all (True), none (False) or these keys.
        self.takes_overrides = takes_overrides

    def add_old_spelling(self, old: str, new: str) -> None:
        """Read the option `old` as `new` (left out of --help and the usage line)."""
        self.old_spellings[old] = new

    def add_list(self, *flags: str, item: Callable[[str], Any] = str, choices: Sequence[str] | None = None,
                 group: Any = None, **kwargs: Any) -> None:
        """An option whose value is a list written A,B,C (`comma_list`), in `group` if given; the older A B C is
        read as A,B,C."""
        kind = CommaList(item, choices)
        (group or self).add_argument(*flags, type=kind, **kwargs)
        for flag in flags:
            self.lists[flag] = kind

    def renamed(self, args: Sequence[str]) -> list[str]:
        """`args` with old option spellings replaced by their new names, and a list given as separate words
        (`--layers 1 3`) joined into the one word it is today (`--layers 1,3`); up to a `--`."""
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                return out + list(args[i:])
            name, eq, value = arg.partition("=")
            out.append(self.old_spellings[name] + eq + value if name in self.old_spellings else arg)
            i += 1
            kind = self.lists.get(self.full_name(out[-1]))
            if kind is not None and i < len(args) and not args[i].startswith("-"):
                words = [args[i]]  # its value, then the words after it that are items of the list too
                while i + len(words) < len(args) and kind.takes(args[i + len(words)]):
                    words.append(args[i + len(words)])
                out.append(",".join(words))
                i += len(words)
        return out

    def given_twice(self, args: Sequence[str]) -> str | None:
        """The first option of one value that `args` give more than once (argparse keeps the last silently: a
        second --config or --checkpoint would replace the first unseen); None when there is none."""
        seen: set[str] = set()
        for arg in args:
            if arg == "--":
                break
            action = self._option_string_actions.get(self.full_name(arg.partition("=")[0]))
            if not arg.startswith("--") or not isinstance(action, argparse._StoreAction):
                continue
            if action.dest in seen:
                return action.option_strings[-1]
            seen.add(action.dest)
        return None

    def full_name(self, option: str) -> str:
        """The option `option` names: itself, or the one option it is the start of (argparse's abbreviation)."""
        names = self._option_string_actions
        if option in names or not option.startswith("--") or not self.allow_abbrev:
            return option
        longer = [n for n in names if n.startswith(option)]
        return longer[0] if len(longer) == 1 else option

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, on the arguments with their old spellings renamed."""
        return super().parse_known_args(self.renamed(sys.argv[1:] if args is None else args), namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, with what it does not recognise refused in one line that says what was meant. Words and
        options may come in any order: an override (or a sentence) after an option is read as one before it."""
        args = self.renamed(sys.argv[1:] if args is None else args)
        self.given = args
        twice = self.given_twice(args)
        if twice:
            self.fail(f"{twice} is given twice, and only one value is read; give it once")
        # Intermixed parsing drops a "--" before the first word, and would read what follows it as options
        # again: with a "--" the words after it are words, as argparse has always read them.
        parse = super().parse_known_args if "--" in args else super().parse_known_intermixed_args
        parsed, extras = parse(args, namespace)  # renamed already
        if extras:
            self.fail(self.unrecognised(extras, args))
        return parsed

    def error(self, message: str) -> NoReturn:
        """argparse's message on one line of stderr (no usage block: --help has it), and exit 2; but an unknown
        option comes first, being the likely cause (--outdir for --out: '--out is required')."""
        given = self.given
        options = given[:given.index("--")] if "--" in given else given
        unknown = [a for a in options if a.startswith("--") and not self.known(a.partition("=")[0])]
        if unknown:
            self.fail(self.unrecognised(unknown, given))
        self.fail(f"{message} ({self.prog} --help lists the options)")

    @staticmethod
    def fail(message: str) -> NoReturn:
        """The one line and exit 2; under torchrun every rank of a machine reads the same command line, so its first
        rank says what is wrong with it, once (each rank printed it)."""
        if os.environ.get("LOCAL_RANK", "0") != "0":
            raise SystemExit(2)
        fail(message)

    def known(self, option: str) -> bool:
        """Whether argparse takes `option`: one of the parser's, or the start of exactly one."""
        names = self._option_string_actions
        return option in names or (self.allow_abbrev and sum(n.startswith(option) for n in names) == 1)

    def option_names(self) -> list[str]:
        """The long options --help shows."""
        return [s for a in self._actions if a.help != argparse.SUPPRESS for s in a.option_strings
                if s.startswith("--") and s != "--help"]

    def unrecognised(self, extras: list[str], args: list[str]) -> str:
        """What to say about arguments argparse did not recognise: the first unknown option, else the first word."""
        option = next((x for x in extras if x.startswith("-") and x != "-"), None)
        if option is None:
            return f"unexpected argument {extras[0]!r}; {self.prog} --help lists the options"
        name, eq, value = option.partition("=")
        if not eq:  # its value, if the next word is one
            at = args.index(option) + 1 if option in args else len(args)
            value = args[at] if at < len(args) and not args[at].startswith("-") and "=" not in args[at] else ""
        def override(key: str) -> str:
            return f"{key}={value or 'VALUE'}"

        key = self.override_for(name)
        if key is not None:
            return f"unknown option {name}; {key} is a config key: use the override {override(key)}"
        # Compared without the dashes, which every option shares (--foo is not near --out): an option that
        # the name starts with or that starts with the name (--beam-size: --beam), else the nearest spelling.
        options = {o.lstrip("-"): o for o in self.option_names()}
        bare = name.lstrip("-")
        close = sorted((o for o in options if min(len(o), len(bare)) >= 3 and (o.startswith(bare) or
                                                                              bare.startswith(o))), key=len)[-1:]
        close = close or difflib.get_close_matches(bare, list(options), n=1, cutoff=0.6)
        if close:
            return f"unknown option {name} (did you mean {options[close[0]]}?)"
        key = self.override_for(name, nearest=True)
        if key:
            return f"unknown option {name} (did you mean the override {override(key)}?)"
        return f"unknown option {name}; {self.prog} --help lists the options"

    def override_for(self, option: str, nearest: bool = False) -> str | None:
        """The config key an unknown --option names (--epochs: train.epochs), when this command takes it as an
        override; with `nearest`, the key it most likely means (--lr: train.lr_factor)."""
        if not self.takes_overrides:
            return None
        from ..config import all_keys
        from ..config.loading import closest_key

        name = option.lstrip("-").replace("-", "_")
        keys = all_keys() if self.takes_overrides is True else sorted(self.takes_overrides)
        named = [k for k in keys if name in (k, k.rpartition(".")[2])]
        if named:
            return named[0]
        return closest_key(name, keys) if nearest or "." in name else None


class CommaList:
    """The type of a list option: 'A,B,C' -> [item('A'), item('B'), item('C')], each one of `choices` if given; a
    bad item is argparse's one line, naming it."""

    def __init__(self, item: Callable[[str], Any] = str, choices: Sequence[str] | None = None) -> None:
        self.item, self.choices = item, choices

    def __call__(self, text: str) -> list[Any]:
        """The list `text` writes."""
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item; write the list as A,B,C")
        what = {int: "a whole number", float: "a number"}.get(self.item, "a value")
        values = []
        for part in parts:
            try:
                values.append(self.item(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{part!r} is not {what} (the list is written A,B,C)") from None
            if self.choices is not None and values[-1] not in self.choices:
                raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(self.choices)}")
        return values

    def takes(self, word: str) -> bool:
        """Whether `word`, after the option's value, is one more item of the list written with spaces (the older
        spelling), not the next option, a dotted override (key=value) or the words of a sentence."""
        if word.startswith("-") or ("=" in word and self.choices is None):
            return False
        try:
            self(word)
        except argparse.ArgumentTypeError:
            return False
        return True


def add_checkpoint(parser: CommandParser, required: bool = True, help: str = CHECKPOINT_HELP) -> None:
    """--checkpoint PATH (old spelling: --model, which named an exported folder)."""
    parser.add_argument("--checkpoint", required=required, default=None, metavar="PATH", type=path_given, help=help)
    parser.add_old_spelling("--model", "--checkpoint")


def add_out(parser: CommandParser, help: str, required: bool = False, default: str | None = None,
            old: Sequence[str] = ("--output",)) -> None:
    """--out PATH (old spelling: --output)."""
    parser.add_argument("--out", required=required, default=default, metavar="PATH", type=path_given, help=help)
    for name in old:
        parser.add_old_spelling(name, "--out")


def path_given(text: str) -> str:
    """A path option's value, refused when empty (`--out ""` wrote into the current folder, or was a traceback)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give the path of a file or folder")
    return text


def check_utf8_arguments(sentences: Sequence[str], input_option: bool = True) -> None:
    """Sentences given as arguments, refused in one line when their bytes are not UTF-8 (Python keeps such bytes as
    lone surrogates, which failed later with a traceback); `input_option`: the command reads --input too."""
    from ..runtime.errors import DataError

    for number, sentence in enumerate(sentences, 1):
        raw = sentence.encode("utf-8", "surrogateescape")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            which = f"sentence {number}" if len(sentences) > 1 else "the sentence"
            file = ", or convert the text into a UTF-8 file and give it as --input" if input_option else ""
            raise DataError(f"{which} given as an argument is not UTF-8 text (it has the byte 0x{raw[exc.start]:02x}); "
                            f"set the terminal to UTF-8 (e.g. LANG=C.UTF-8){file}") from None


def add_overwrite(parser: CommandParser, help: str = "replace an existing --out (without it the command refuses "
                  "to)") -> None:
    """--overwrite: the one way every command that writes a file is allowed to replace an existing one."""
    parser.add_argument("--overwrite", action="store_true", help=help)


def check_out_file(out: str | Path, overwrite: bool, inputs: dict[str, str | Path | None]) -> None:
    """The rule for a command's --out FILE, checked before any work: never one of the files the command reads
    (`inputs`: option -> path), not even with --overwrite; never a folder; an existing file only with --overwrite."""
    from ..runtime.errors import UserError

    path = Path(out)
    for option, given in inputs.items():
        if given is not None and str(given) != "-" and same_file(path, Path(given)):
            raise UserError(f"--out {out} is the {option} file, which the command reads: it is never replaced, not "
                            "even with --overwrite; choose another --out")
    checkpoint = inputs.get("--checkpoint")
    folder = kept_in_model_folder(path, Path(checkpoint)) if checkpoint is not None else None
    refuse_a_runs_file(out, folder or kept_by_a_run(path))
    if path.is_dir():
        raise UserError(f"--out {out} is a folder; give the path of the file to write")
    refuse_to_replace(path, overwrite)


def refuse_a_runs_file(out: str | Path, folder: Path | None) -> None:
    """The one line for an --out that names what the run or export in `folder` keeps (None: nothing to refuse)."""
    from ..runtime.errors import UserError

    if folder is not None:
        kind = "folder" if Path(out).is_dir() else "file"
        raise UserError(f"--out {out} is a {kind} of the run or export in {folder} (its weights, state, records, "
                        "charts or vocabulary), which the commands read: it is never replaced, not even with "
                        "--overwrite; choose another --out")


def kept_by_a_run(path: Path) -> Path | None:
    """The run or export folder above `path` when `path` is a file or folder it keeps there (`kept_in_model_folder`);
    None otherwise. A run's folder holds the run marker (or, from an older version, last.pt beside metrics.jsonl),
    an export's model.bin beside config.json: another tool's last.pt alone makes no folder a run's."""
    from ..harness.run_dir import MARKER

    signs = ((MARKER,), ("last.pt", "metrics.jsonl"), ("model.bin", "config.json"))
    for folder in path.expanduser().resolve().parents:
        if any(all((folder / name).exists() for name in sign) for sign in signs):
            return kept_in_model_folder(path, folder)
    return None


def kept_in_model_folder(path: Path, checkpoint: Path) -> Path | None:
    """The folder of `checkpoint` (a run directory or an exported folder, or the one a model file lies in) when
    `path` names a file that the run or export keeps there (the names training and export write: weights, last.pt,
    config.yaml, metrics.jsonl, vocab/, ...); None otherwise, and for evaluate's hypotheses (NAME.beamK.txt)."""
    import re

    from ..deploy.ct2_export import EXPORT_NAMES
    from ..harness.run_dir import MARKER, OWN_NAMES

    given = checkpoint.expanduser().resolve()
    folder = given if given.is_dir() else given.parent
    own = any((folder / name).exists() for name in (MARKER, "last.pt", "model.bin"))
    if not (own or ((folder / "config.yaml").is_file() and (folder / "vocab").is_dir())):
        return None  # not a run's or an export's folder: a model file among your own files
    try:
        inside = path.expanduser().resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return None
    if not inside.parts or re.search(r"\.beam\d+\.txt$", inside.name):
        return None
    top = inside.parts[0]
    return folder if OWN_NAMES.match(top) or EXPORT_NAMES.match(top) else None


def add_quantize(parser: CommandParser, help: str = QUANTIZE_HELP, aliases: dict[str, str] | None = None) -> None:
    """--quantize none|int8|bf16 (old spelling: --quantization); `aliases`: older values, read as today's."""
    def value(text: str) -> str:
        if aliases and text in aliases:
            print(f"note: --quantize {text} is now spelled --quantize {aliases[text]}", file=sys.stderr)
            return aliases[text]
        return text

    parser.add_argument("--quantize", default="none", type=value, choices=QUANTIZE, help=help)
    parser.add_old_spelling("--quantization", "--quantize")


def add_limit(parser: CommandParser, help: str) -> None:
    """--limit N (old spelling: --sentences)."""
    parser.add_argument("--limit", type=int, default=None, metavar="N", help=help)
    parser.add_old_spelling("--sentences", "--limit")


def add_device(parser: CommandParser, help: str = "cpu, cuda, cuda:N or mps (default: the best available)"
               ) -> None:
    """--device NAME."""
    parser.add_argument("--device", default=None, help=help)


def add_beam(parser: CommandParser) -> None:
    """--beam K: the checkpoint's decode.beam_size unless given, in every command that decodes."""
    parser.add_argument("--beam", type=int, default=None, metavar="K",
                        help="beam width, 1 for greedy (default: the checkpoint's decode.beam_size)")


def add_decoding(parser: CommandParser) -> None:
    """--beam, --alpha and the token-reduction ratios: how translate and evaluate decode."""
    add_beam(parser)
    parser.add_argument("--alpha", type=float, default=None, metavar="A",
                        help="length-penalty exponent for beam search (default: the checkpoint's decode.alpha)")
    # Older: the engine follows from --checkpoint (an exported folder is CTranslate2's); given, it must agree.
    parser.add_argument("--engine", default=None, choices=["torch", "ctranslate2"], help=argparse.SUPPRESS)
    parser.add_argument("--merge-ratio", type=float, default=None, metavar="R",
                        help="token merging at inference: merge this fraction of each source sentence's tokens in "
                             "every merging encoder layer (0-0.5; default: as the checkpoint was trained)")
    parser.add_argument("--prune-ratio", type=float, default=None, metavar="R",
                        help="token pruning at inference: drop this fraction of each source sentence's tokens, the "
                             "least attended, in every merging encoder layer (0-0.5)")


def add_batch_size(parser: CommandParser) -> None:
    """--batch-size N: how many sentences translate and evaluate decode together."""
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="sentences decoded together (default: the checkpoint's decode.batch_size)")


def add_data_root(parser: CommandParser) -> None:
    """`data.root=DIR` as an override, and --data-root DIR, its older spelling (evaluate, sweep)."""
    parser.add_argument("--data-root", default=None, metavar="DIR", help=argparse.SUPPRESS)


def overridden(overrides: Sequence[str], key: str) -> str | None:
    """The value the last of `overrides` that sets `key` (or its older name) gives it, as written; None if none."""
    from ..config import renamed

    value = None
    for override in overrides:
        name, _, raw = override.partition("=")
        if renamed(name.strip(), None)[0] == key:
            value = raw
    return value


def data_root(args: argparse.Namespace, command: str) -> str | None:
    """The Multi30k folder that --data-root or a `data.root=DIR` override names (None: as the checkpoint has it).

    Only `data.root` is taken: the other settings come from the checkpoint. A mistyped key or a bad
    value is the config's own one line (with its suggestion), as in every command.
    """
    from ..config import Config, apply_override
    from ..runtime.errors import ConfigError

    for override in args.overrides:
        apply_override(Config(), override)  # the form, the key and the value, checked as train checks them
        key = override.split("=", 1)[0].strip()
        if overridden([override], "data.root") is None:
            raise ConfigError(f"{command} takes only the override data.root=DIR; {key} comes from the checkpoint")
    given = overridden(args.overrides, "data.root")
    return args.data_root if given is None else given
