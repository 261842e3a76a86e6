"""``otpmesh run TREE``: start a supervision tree from a spec file and watch it.

On a terminal the tree is redrawn in place as its event log grows; otherwise (a pipe, a file,
``--plain``) it prints the tree when started, one line per event, and the tree when stopped.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from dataclasses import dataclass
from typing import IO, Any

import trio

from .._controller._app import App, PlacementName, start
from .._controller._watch import watched_apps
from .._core._errors import UsageError
from .._core._spec import Mesh, Supervisor, Worker, walk
from .._runtime._run import run
from ..chaos import FAULTS, ChaosMonkey
from ._display import Display, LiveDisplay, PlainDisplay, Watch
from ._specfile import Driver, load_target

DESCRIPTION = """\
Start the supervision tree TREE names (otpmesh.start) and show it live: every
supervisor, mesh and actor with its state, incarnation, restarts and last exit,
as the tree's event log tells them.

On a terminal the view is redrawn in place, with the recent events and the
output of the actors below it. When stdout is not a terminal (or with --plain)
it prints the tree, then one line per event as it happens, then the tree again
when stopped.

Ctrl-C stops the tree (exit status 130), and so does SIGTERM (143); a root
supervisor that gives up ends the run with status 1 and says why; a TREE that
cannot be loaded, status 2.
"""

EXAMPLES = """\
examples:
  otpmesh run supervisors/rl_pipeline.py                  # until Ctrl-C
  otpmesh run supervisors.serving_replicas --local --duration 5
  otpmesh run supervisors/rl_pipeline.py --chaos 2 --chaos-targets 'rl/rollouts/*'
  otpmesh run my_job.py:make_tree --events run.jsonl | tee run.log
"""


def add_to(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="start a supervision tree and watch it live",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target",
        metavar="TREE",
        help="a spec file or module, with :NAME for an attribute other than `tree` (a "
        "Supervisor or Mesh, or a function returning one): supervisors/rl_pipeline.py, "
        "supervisors.rl_pipeline, my_job.py:make_tree",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help='run every actor in this process (placement="local"), not in worker processes',
    )
    parser.add_argument(
        "--events",
        metavar="FILE",
        help="also record the event log to FILE, one JSON object per line (read it with "
        "`otpmesh events FILE`)",
    )
    parser.add_argument(
        "--duration",
        type=_seconds,
        metavar="SECONDS",
        help="stop the tree after SECONDS (default: run until Ctrl-C)",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="for a driver (job.py:main) whose trees start with takeover=otpmesh.Takeover(...): "
        "run it as the standby controller, which waits for the active one's lease and takes "
        "its tree over when it dies (docs/guides/takeover.md)",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print lines even on a terminal (the default when stdout is not a terminal)",
    )
    parser.add_argument(
        "--snapshots",
        type=_seconds,
        metavar="SECONDS",
        help="with plain output, also print the tree every SECONDS",
    )
    chaos = parser.add_argument_group(
        "chaos", "throw faults at the actors (otpmesh.chaos.ChaosMonkey) and watch the tree recover"
    )
    chaos.add_argument(
        "--chaos", type=_seconds, metavar="RATE", help="faults per second, on average"
    )
    chaos.add_argument(
        "--chaos-faults",
        default="crash,kill",
        metavar="KINDS",
        help=f"comma-separated, drawn with equal weights, from: {', '.join(FAULTS)} "
        "(default: crash,kill)",
    )
    chaos.add_argument(
        "--chaos-targets",
        action="append",
        metavar="GLOB",
        help="actor paths to aim at, e.g. 'rl/rollouts/*' (repeatable; default: every actor)",
    )
    chaos.add_argument(
        "--chaos-seed",
        type=int,
        default=0,
        metavar="N",
        help="the same seed throws the same faults at the same tree (default: 0)",
    )
    parser.set_defaults(handler=run_command)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


@dataclass(frozen=True, slots=True)
class Options:
    """What ``otpmesh run`` was asked to do, checked."""

    target: str
    placement: PlacementName
    events_file: IO[str] | None
    duration: float | None
    live: bool
    snapshots: float | None
    chaos_rate: float | None
    chaos_faults: tuple[str, ...]
    chaos_targets: tuple[str, ...]
    chaos_seed: int


def run_command(args: argparse.Namespace) -> int:
    tree = load_target(args.target)
    if not isinstance(tree, Supervisor | Mesh):
        return _run_driver(args, tree)
    if args.standby:
        raise UsageError(
            f"--standby: for a driver (job.py:main) that starts its tree with "
            f"takeover=otpmesh.Takeover(...); {args.target} is a tree"
        )
    faults = tuple(f.strip() for f in args.chaos_faults.split(",") if f.strip())
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or not faults:
        raise UsageError(f"--chaos-faults: unknown fault {unknown}; known: {', '.join(FAULTS)}")
    targets = tuple(args.chaos_targets or ("*",))
    if args.chaos and not _actors_matching(tree, targets):
        raise UsageError(f"--chaos-targets {list(targets)} match no actor of {tree.id}")
    events_file = _open_for_writing(args.events) if args.events else None
    options = Options(
        target=args.target,
        placement="local" if args.local else "procs",
        events_file=events_file,
        duration=args.duration,
        live=_live(args),
        snapshots=args.snapshots,
        chaos_rate=args.chaos,
        chaos_faults=faults,
        chaos_targets=targets,
        chaos_seed=args.chaos_seed,
    )
    try:
        run(watch, tree, options)  # Ctrl-C: status 130; a root that gives up: status 1
    finally:
        if events_file is not None:
            events_file.close()
    return 0


def _heading(options: Options) -> str:
    chaos = "" if options.chaos_rate is None else f", chaos {options.chaos_rate:g}/s"
    return f"otpmesh run {options.target} ({options.placement}{chaos})"


def _live(args: argparse.Namespace) -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb" and not args.plain


def _run_driver(args: argparse.Namespace, driver: Driver) -> int:
    """``otpmesh run job.py:main``: run the driver as the program's main, showing the trees it
    starts (one at a time, the first still running) as ``otpmesh run TREE`` shows its tree."""
    options = {
        "--local": args.local,
        "--events": args.events,
        "--chaos": args.chaos,
        "--duration": args.duration,
    }
    given = [flag for flag, value in options.items() if value]
    if given:
        raise UsageError(
            f"{', '.join(given)}: for a TREE; {args.target} is a driver, which starts its own "
            "trees (pass such options to otpmesh.start in it)"
        )
    run(drive, driver, args.target, _live(args), args.snapshots, standby=args.standby)
    return 0


async def drive(driver: Driver, target: str, live: bool, every: float | None) -> None:
    """Run `driver` with its trees on the display until it returns."""
    async with trio.open_nursery() as showing:
        showing.start_soon(_show_trees, target, live, every)
        try:
            await driver()
        finally:
            showing.cancel_scope.cancel()


async def _show_trees(target: str, live: bool, every: float | None) -> None:
    watched = watched_apps()
    while True:
        while not watched.apps:
            await watched.changed.wait()
        ctx = watched.apps[0]
        state = Watch(ctx.tree, f"otpmesh run {target} ({ctx.tree.id})")
        state.log = ctx.events
        display: Display = (
            LiveDisplay("    Ctrl-C stops the program") if live else PlainDisplay(_say, every)
        )
        display.started(state)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(display.run, state)
                display.events(state, state.catch_up())
                async for _ in ctx.events.subscribe():
                    display.events(state, state.catch_up())
                nursery.cancel_scope.cancel()
        finally:
            display.finished(state, state.catch_up())
        while ctx in watched.apps:
            await watched.changed.wait()


def _actors_matching(tree: Supervisor | Mesh, globs: tuple[str, ...]) -> list[str]:
    actors = [path for path, spec in walk(tree) if isinstance(spec, Worker)]
    return [p for p in actors if any(fnmatch.fnmatchcase(p, g) for g in globs)]


def _open_for_writing(path: str) -> IO[str]:
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--events: cannot write {path}: {exc.strerror}") from None


async def watch(tree: Supervisor | Mesh, options: Options) -> None:
    """Start the tree, follow its log on the display until the duration ends or Ctrl-C."""
    state = Watch(tree, _heading(options))
    display: Display = LiveDisplay() if options.live else PlainDisplay(_say, options.snapshots)
    if options.live:
        print(f"{state.heading()}: starting {tree.id}...", flush=True)
    # The display's nursery is outside the tree's: it keeps drawing while the tree stops.
    async with trio.open_nursery() as drawing:
        try:
            async with start(
                tree, placement=options.placement, events_file=options.events_file
            ) as app:
                state.log = app.events
                state.catch_up()
                display.started(state)
                drawing.start_soon(display.run, state)
                try:
                    await _watch_running(app, state, display, options)
                except BaseException as exc:
                    if _interrupted(exc):
                        display.stopping(state, "Ctrl-C")
                    raise
        finally:
            drawing.cancel_scope.cancel()
            if state.log is not None:
                display.finished(state, state.catch_up())


async def _watch_running(app: App, state: Watch, display: Display, options: Options) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_follow, app, state, display)
        if options.chaos_rate is not None:
            nursery.start_soon(_monkey(app, options).run)
        if options.duration is None:
            await trio.sleep_forever()
        await trio.sleep(options.duration)
        display.stopping(state, f"--duration {options.duration:g} s")
        nursery.cancel_scope.cancel()


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return isinstance(exc, KeyboardInterrupt)


def _say(text: str) -> None:
    print(text, flush=True)  # a line at a time, also into a pipe


async def _follow(app: App, state: Watch, display: Display) -> None:
    # No checkpoint between this catch-up and the subscription: no entry falls between them.
    display.events(state, state.catch_up())
    async for _ in app.events.subscribe():
        display.events(state, state.catch_up())


def _monkey(app: App, options: Options) -> ChaosMonkey:
    return ChaosMonkey(
        app,
        seed=options.chaos_seed,
        rate=options.chaos_rate or 1.0,
        targets=options.chaos_targets,
        faults=dict.fromkeys(options.chaos_faults, 1.0),
    )
