"""``otpmesh stacks PID``: what every actor of a running app is doing now."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

from rich.console import Console
from rich.text import Text

from .._controller._inspect import Stacks, app_dir, running_apps, stacks_file
from .._controller._stacksdir import usual_dir, why_untrusted
from .._core._errors import UsageError

DESCRIPTION = """\
Print what every actor of a running otpmesh app is doing now: 'idle', or the
endpoint it serves with its frames (innermost first), actors with identical
stacks grouped together. PID is the app's controller process (the one that
called otpmesh.start, e.g. `otpmesh run`); it must be yours, and may be left
out when only one app is running. The app answers SIGUSR2 by writing its
stacks to a file only you can read.
"""

EXAMPLES = """\
examples:
  otpmesh stacks 4242
  otpmesh stacks 4242 --path rl/rollouts
  otpmesh stacks
"""

#: How long the app has to answer.
WAIT = 10.0


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "stacks",
        help="print what every actor of a running app is doing",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "pid", type=int, nargs="?", help="the app's controller process (default: the only one)"
    )
    parser.add_argument("--path", default="", help="only the actors at or below this path")
    parser.add_argument("--json", action="store_true", help="print the stacks as JSON")
    parser.set_defaults(handler=run)


def ask(pid: int, wait: float = WAIT) -> Stacks:
    """Signal the app at `pid` and read the stacks it writes."""
    directory = app_dir(pid)
    if directory is None:
        raise UsageError(
            f"process {pid} is not a running otpmesh app of yours{_apps_hint()}{_squatted()}"
        )
    target = stacks_file(directory, pid)
    before = target.stat().st_mtime_ns if target.exists() else 0
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        raise UsageError(f"no process {pid}") from None
    except PermissionError:
        raise UsageError(f"process {pid} is not yours") from None
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if target.exists() and target.stat().st_mtime_ns != before:
            with open(target) as f:
                return Stacks.from_json(json.load(f))
        time.sleep(0.05)
    raise UsageError(
        f"process {pid} wrote no stacks within {wait:g} s: is it an otpmesh app "
        "(inside otpmesh.start), with SIGUSR2 left to otpmesh?"
    )


def _squatted() -> str:
    """A note when the usual stacks directory exists but is not trusted (someone else's)."""
    usual = usual_dir()
    why = why_untrusted(usual)
    if why is None or not os.path.lexists(usual):
        return ""
    return (
        f"; {usual} is not a private directory of yours ({why}), so nothing in it is trusted: "
        "apps use a private one beside it, and removing it (as its owner, or root) restores "
        "the usual place"
    )


#: How many of an app's actors a wrong --path names.
NAMED = 8


def _no_such_actors(pid: int, every: Stacks) -> str:
    if not every.actors:
        return f"app {pid} has no running actors"
    paths = sorted(every.actors)
    more = f" and {len(paths) - NAMED} more" if len(paths) > NAMED else ""
    return f"no actor of app {pid} is at or below it (its actors: {', '.join(paths[:NAMED])}{more})"


def _apps_hint() -> str:
    apps = running_apps()
    return f" (running apps: {', '.join(map(str, apps))})" if apps else " (none is running)"


def run(args: argparse.Namespace) -> int:
    pid = args.pid
    if pid is None:
        apps = running_apps()
        if len(apps) != 1:
            raise UsageError(f"say which app: PID{_apps_hint()}")
        pid = apps[0]
    every = ask(pid)
    stacks = every.under(args.path)
    if args.path and not stacks.actors:
        raise UsageError(f"--path {args.path!r}: {_no_such_actors(pid, every)}")
    if args.json:
        print(json.dumps(stacks.to_json(), indent=2))
        return 0
    if not stacks.actors:
        print("no running actors" + (f" under {args.path}" if args.path else ""))
        return 0
    console = Console(highlight=False)
    for line in str(stacks).splitlines():
        if not line.startswith(" "):
            style = "bold"  # a group's or a process's heading
        elif line.lstrip().startswith("at "):
            style = "cyan"
        else:
            style = ""
        console.print(Text(line, style=style))
    return 0
