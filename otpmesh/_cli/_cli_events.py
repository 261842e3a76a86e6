"""``otpmesh events FILE``: a recorded event log as a readable timeline."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import IO, Any

from .._core._errors import UsageError
from . import _timeline

FOLLOW_EVERY = 0.2  # seconds between looks at a followed file

DESCRIPTION = """\
Show an event log recorded by `otpmesh run --events FILE` or by
otpmesh.start(tree, events_file=f) (one JSON object per line) as a timeline:
seconds since the first event, kind, path, #incarnation and reason.

Exit status 2 when the file is missing or a line is not an event; the message
names the line.
"""

EXAMPLES = """\
examples:
  otpmesh events run.jsonl
  otpmesh events run.jsonl --path rl/rollouts --kind child_exited,child_started
  otpmesh events run.jsonl --follow        # as `tail -f`: Ctrl-C ends it
"""


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "events",
        help="show a recorded event log as a timeline",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE", help="a JSON-lines event log")
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only events of this path and below it, e.g. rl/rollouts (repeatable)",
    )
    parser.add_argument(
        "--kind",
        action="append",
        default=[],
        metavar="KIND",
        help=f"only these kinds, comma-separated (repeatable): {', '.join(_timeline.KINDS)}",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep reading as the file grows (a run still recording it), until Ctrl-C",
    )
    parser.set_defaults(handler=events_command)


def events_command(args: argparse.Namespace) -> int:
    kinds = _timeline.check_kinds(k for arg in args.kind for k in arg.split(","))
    try:
        file = open(args.file, encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no such file: {args.file}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    t0: float | None = None
    try:
        with file:
            for event in _timeline.read(_lines(file, args.file, args.follow), args.file):
                t0 = event.time if t0 is None else t0
                if _timeline.matches(event, args.path, kinds):
                    print(_timeline.line(event, t0), flush=args.follow)
    except KeyboardInterrupt:
        return 130  # --follow ends this way; the lines so far are the output
    return 0


def _lines(file: IO[str], name: str, follow: bool) -> Iterator[str]:
    """The file's lines; with `follow`, also those written later (whole lines only)."""
    pending = ""
    while True:
        try:
            text = file.readline()
        except UnicodeDecodeError as exc:
            raise UsageError(f"{name}: not UTF-8 text ({exc.reason})") from None
        if text.endswith("\n"):
            yield pending + text
            pending = ""
        elif text:
            pending += text  # a line still being written, or a last line without a newline
        elif not follow:
            if pending:
                yield pending
            return
        else:
            time.sleep(FOLLOW_EVERY)
