"""The command line: `python -m annotated_transformer COMMAND ...`, `annotated-transformer COMMAND ...`, and the
thin scripts/ of a checkout all run the same `main(argv, prog)` of one module here per command.

Nothing is imported until a command runs, so `--help` answers at once.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from ..runtime.errors import run_cli

# command -> (module in this package, what it does)
COMMANDS = {
    "train": ("train", "train a Transformer from a config (Multi30k, your own parallel text, or the copy task)"),
    "translate": ("translate", "translate sentences: typed at a prompt, given as arguments, a file or a pipe"),
    "evaluate": ("evaluate", "score a trained model with sacreBLEU and chrF (a split of its data, or "
                 "--input/--ref files)"),
    "export": ("export", "export a trained model to CTranslate2 (float32, int8 or bf16 weights)"),
    "visualize": ("visualize", "chart what a trained model attends to on one sentence"),
    "average-checkpoints": ("average", "average the weights of several checkpoints of one run"),
    "sweep": ("sweep", "train a grid of settings x seeds and report mean +/- sd"),
    "benchmark": ("benchmark", "measure training and decoding speed against baselines"),
    "prepare-data": ("prepare_data", "check, tokenise and cache a config's data (Multi30k or your own files); "
                     "print statistics"),
    "make-synthetic-corpus": ("make_synthetic_corpus", "write a parallel corpus of WMT length from Multi30k's lines "
                              "(benchmark --scale)"),
}
# Each script in scripts/ is named after its command ('-' as '_'); a command's older name still runs it.
ALIASES = {"average": "average-checkpoints"}
PROG = "python -m annotated_transformer"


def command_name(given: str) -> str | None:
    """The command `given` names ('_' for '-' and the older names too), or None."""
    name = given.replace("_", "-")
    name = ALIASES.get(name, name)
    return name if name in COMMANDS else None


def usage(prog: str = PROG) -> str:
    """The list of commands, as --help prints it."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: {prog} COMMAND [options]   ({prog} COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(lines)


def run(command: str, argv: list[str], prog: str, whole_process: bool = False) -> None:
    """Run one command with its arguments: its one-line errors and exit code as every script has them.

    `whole_process`: the command is this process's own (a script, `python -m`, the console command), so it
    runs the command module's launcher step first, where it has one (`launch`: the train command's restarts
    the process under tcmalloc on the CPU). A command called in-process (a test, a notebook) never restarts it.
    """
    command = command_name(command) or command
    module = importlib.import_module(f".{COMMANDS[command][0]}", __name__)

    def command_main() -> int | None:
        if whole_process and hasattr(module, "launch"):
            module.launch(argv)  # returns where no restart applies
        return module.main(argv, prog=prog)

    run_cli(command_main, whole_process)


def main(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Dispatch `COMMAND [options]` to its module; an unknown command is one line listing the commands."""
    whole_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(prog))
        raise SystemExit(0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        from .. import __version__

        print(f"annotated-transformer {__version__}")
        raise SystemExit(0)
    command = command_name(argv[0])
    if command is None:
        close = difflib.get_close_matches(argv[0].replace("_", "-"), list(COMMANDS), n=1, cutoff=0.6)
        meant = f" (did you mean {close[0]}?)" if close else ""
        print(f"error: unknown command '{argv[0]}'{meant}; the commands are: {', '.join(COMMANDS)} "
              f"({prog} --help says what each does)", file=sys.stderr)
        raise SystemExit(2)
    run(command, argv[1:], f"{prog} {command}", whole_process)


def console_main() -> None:
    """The `annotated-transformer` console command."""
    main(prog="annotated-transformer")
