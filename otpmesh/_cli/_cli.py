"""The ``otpmesh`` command: a small dispatcher over one module per subcommand.

Each subcommand module has ``add_to(commands)``, which adds its parser to the argparse
subparsers and sets ``handler``: a function of the parsed arguments that returns the exit status.
Adding a command is one module and one entry in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .. import __version__
from .._core._errors import UsageError
from . import _cli_agent, _cli_bench, _cli_events, _cli_run, _cli_stacks, _cli_watch

COMMANDS = (_cli_run, _cli_watch, _cli_events, _cli_stacks, _cli_bench, _cli_agent)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="otpmesh",
        description="Erlang/OTP-style supervision for single-controller PyTorch programs: run "
        "and watch a supervision tree, read a recorded event log, measure.",
        epilog="`otpmesh COMMAND --help` says more about each command.",
    )
    top.add_argument("--version", action="version", version=f"otpmesh {__version__}")
    commands = top.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    commands.required = True
    for command in COMMANDS:
        command.add_to(commands)
    return top


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line `argv` (default: sys.argv[1:]) and exit with its status."""
    args = parser().parse_args(argv)
    try:
        status = args.handler(args)
    except UsageError as exc:
        print(f"otpmesh {args.command}: {exc}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        status = 130  # before anything started (a tree's run says so itself)
    except BrokenPipeError:
        # The reader went away (`otpmesh events log.jsonl | head`): no traceback for that.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    raise SystemExit(status)
