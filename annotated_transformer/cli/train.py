"""`train --config NAME [section.key=value ...]`: one process (CPU, one GPU) or one rank under torchrun."""

from __future__ import annotations

import argparse
import contextlib
import io
import os

from ..config import Config, config_parser, load_config
from ..runtime.errors import ConfigError
from ..harness.malloc import RESTARTED_ENV, preload_or_note
from .options import CommandParser, path_given


def build_parser(prog: str | None = None) -> CommandParser:
    """The command's options."""
    parser = config_parser("Train the Transformer: the copy task, Multi30k (de->en or en->de) or your own parallel "
                           "text (data.dataset=files).", prog, CommandParser, takes_overrides=True)
    parser.add_argument("--out", default=None, metavar="DIR", type=path_given,
                        help="the run directory (the same as train.out_dir=DIR, refused beside a train.out_dir= "
                             "that names another; default: runs/<config name>)")
    parser.add_argument("--device", default=None,
                        help="the same as train.device=DEVICE (refused beside another train.device=): auto, cpu, "
                             "cuda, cuda:N or mps")
    parser.add_argument("--quiet", action="store_true",
                        help="show only warnings, errors and the final result lines, no progress bar (the run "
                             "directory's train.log still gets every line)")
    return parser


def parse(argv: list[str] | None = None, prog: str | None = None) -> tuple[argparse.Namespace, Config]:
    """The command line's options and its config: --config, the shorthands, then the dotted overrides (which win)."""
    args = build_parser(prog).parse_args(argv)
    shorthands = [f"train.out_dir={args.out}"] * (args.out is not None) + \
        [f"train.device={args.device}"] * (args.device is not None) + ["train.progress=false"] * args.quiet
    cfg = load_config(args.config, [*shorthands, *args.overrides])  # the overrides come last: they win
    for option, key, given, now in (("--out", "out_dir", args.out, cfg.train.out_dir),
                                    ("--device", "device", args.device, cfg.train.device)):
        same = _folder(given) == _folder(now) if option == "--out" else str(given) == str(now)
        if given is not None and not same:
            raise ConfigError(f"{option} {given} and train.{key}={now} say different things; give one of them")
    return args, cfg


def _folder(path: object) -> str:
    """A path as the folder it names (~ expanded, made absolute): runs/a, ./runs/a and runs/a/ are one."""
    return os.path.abspath(os.path.expanduser(str(path)))


def relaunch_with_malloc(argv: list[str] | None = None) -> None:
    """The launcher's step before `main`, in a process of the train command's own: on the CPU, restart this
    process under tcmalloc (`train.malloc`; harness.malloc, docs/training.md "tcmalloc on the CPU").

    It reads the command line quietly for train.malloc and train.device, then, where a library applies,
    replaces this process with the same command with it preloaded (exec: the same process id); otherwise it
    returns, having said how to install tcmalloc where that would help. A command line that does not parse is
    left to `main`, which says what is wrong with it; a restarted process goes straight on.
    """
    if RESTARTED_ENV in os.environ:  # restarted already: nothing to choose again
        return
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cfg = parse(argv)[1]
    except (Exception, SystemExit):
        return
    preload_or_note(cfg.train.malloc, cfg.train.device)


launch = relaunch_with_malloc  # the launcher step the dispatcher runs before main (cli.run)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Train from a config; the exit code of a run stopped by a signal is 128 + its number.

    The way to `train_step`: main -> harness.trainer.train_worker -> Trainer.fit -> Trainer.train_epoch ->
    harness.train_loop.train_loop -> loop.train_step. Run as a process of its own (scripts/train.py,
    `python -m annotated_transformer train`, the console command), the launcher calls `launch` (`relaunch_with_malloc`)
    first; a call from Python (a test, a notebook) leaves its process as it is.
    """
    args, cfg = parse(argv, prog)
    from ..harness.distributed import quiet_terminal
    from ..harness.trainer import train_worker  # the harness loads after the config is known to be good

    with quiet_terminal(args.quiet):
        results = train_worker(cfg)
    return 128 + int(results["stopped_by"]) if "stopped_by" in results else 0
