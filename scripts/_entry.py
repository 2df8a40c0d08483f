"""What every script here does: run its command from annotated_transformer.cli (the code that
`python -m annotated_transformer COMMAND` runs), or say in one line how to set up."""

import signal
import sys
from pathlib import Path


def run_command(command: str) -> None:
    """Run `command` with this script's arguments; without the package installed, one line and exit 2."""
    interrupted: list[int] = []
    # A Ctrl-C while torch loads (seconds) waits for the end of the import: raised inside torch's C start-up (its
    # import of NumPy), it was swallowed there and the command went on as if never stopped. Only Python's own
    # handler is replaced (an ignored SIGINT stays ignored). runtime.errors.interrupt_after does this for the
    # package, which cannot be imported here without torch.
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        try:
            from annotated_transformer.cli import run
        finally:
            if ours:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        if interrupted:
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # the commands' own line, not a traceback
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except ModuleNotFoundError as exc:
        script = Path(sys.argv[0]).name
        print(f"error: this Python ({sys.executable}) lacks {exc.name!r}, which annotated-transformer needs: run "
              f"`uv run python scripts/{script} ...` from the checkout (uv sets up the environment from uv.lock "
              "on first use), or `pip install -e .` first", file=sys.stderr)
        raise SystemExit(2) from None
    run(command, sys.argv[1:], prog=f"scripts/{Path(sys.argv[0]).name}", whole_process=True)
