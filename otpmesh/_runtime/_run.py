"""``otpmesh.run``: run an async main under trio with otpmesh's shutdown behaviour."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import trio

from .._wire._owntasks import interrupt
from .._wire._owntasks import spawn as spawn_own
from ._gcpace import pace

T = TypeVar("T")

# Set in worker processes: there, importing the controller's main file must not start a program.
IN_WORKER = False

#: Seconds after Ctrl-C before a stop still under way says what it is waiting for.
SLOW_STOP_NOTICE = 1.0
SLOW_STOP = (
    "stopping: waiting for the actors to stop (one busy in a plain-def endpoint is killed "
    "after its shutdown timeout)"
)
#: How many actors a slow stop names before it says "and N more".
NAMED = 8
#: Exit statuses of a program stopped by Ctrl-C and by SIGTERM (128 + the signal, as a shell
#: reports a process killed by it), after the orderly stop.
INTERRUPTED_STATUS = 130
TERMINATED_STATUS = 143

# Whether this trio run's controller is a standby (``otpmesh.run(..., standby=True)``, ``otpmesh
# run --standby``): a start with a takeover then waits for the lease (_controller/_takeover.py).
_STANDBY: trio.lowlevel.RunVar[bool] = trio.lowlevel.RunVar("otpmesh_standby", default=False)


def run_is_standby() -> bool:
    """Whether ``otpmesh.run`` was asked to run this program as a standby controller."""
    return _STANDBY.get()


# What a stop under way waits for, per trio run: each running tree adds its own while it runs
# (otpmesh.start, through ``stop_watched``).
_WAITING: trio.lowlevel.RunVar[list[Callable[[], Sequence[str]]]] = trio.lowlevel.RunVar(
    "otpmesh_waiting_for"
)


@contextmanager
def stop_watched(waiting_for: Callable[[], Sequence[str]]) -> Iterator[None]:
    """While the block runs, a slow stop after Ctrl-C names the actors ``waiting_for()`` lists
    (those asked to stop and not gone yet)."""
    try:
        sources = _WAITING.get()
    except LookupError:
        sources = []
        _WAITING.set(sources)
    sources.append(waiting_for)
    try:
        yield
    finally:
        sources.remove(waiting_for)


def waiting_for() -> list[str]:
    """Every actor a stop under way in this trio run waits for."""
    try:
        sources = _WAITING.get()
    except LookupError:
        return []
    return [path for source in sources for path in source()]


def slow_stop_text(paths: Sequence[str]) -> str:
    """What a slow stop says: the actors it waits for, or the general words if none is named."""
    if not paths:
        return SLOW_STOP
    named = ", ".join(paths[:NAMED]) + (
        f" and {len(paths) - NAMED} more" if len(paths) > NAMED else ""
    )
    return (
        f"stopping: waiting for {named} to stop (one busy in a plain-def endpoint is killed "
        "after its shutdown timeout)"
    )


def _only_interrupts(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_interrupts(e) for e in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt | trio.Cancelled)


class _Signals:
    """Which stop signal `run` received, if any (Ctrl-C and SIGTERM stop alike)."""

    def __init__(self) -> None:
        self.received: int | None = None


def stops_on_sigterm() -> bool:
    """Whether SIGTERM is taken as an orderly stop now (inside ``otpmesh.run``)."""
    return getattr(signal.getsignal(signal.SIGTERM), "otpmesh_orderly_stop", False) is True


def run(main: Callable[..., Awaitable[T]], *args: Any, standby: bool = False) -> T:
    """Run `main(*args)` under trio. Workers never outlive it; Ctrl-C stops everything with one
    short message and exit status 130 (and, when the stop takes more than a second, a word on
    stderr meanwhile); SIGTERM (``kill``, Kubernetes, Slurm) stops it the same way, each
    actor's ``on_stop`` running within its shutdown, and exits with status 143. Either signal
    reaches your code (main and the tasks it started) as trio's ``KeyboardInterrupt``; one
    that lands in otpmesh's own tasks is handed to main at its next checkpoint instead, so the
    runtime is never cut off mid-frame and the stop stays orderly. A supervision
    tree that gives up exits with status 1 and a message naming the supervisor and the last
    exit reasons. With `standby`, every ``otpmesh.start(tree, takeover=...)`` in it waits for
    the active controller's lease, as ``Takeover(..., standby=True)`` does
    (docs/guides/takeover.md); a standby whose run stopped in order exits with status 0."""
    if not isinstance(standby, bool):
        raise TypeError(f"otpmesh.run(..., standby=...) is True or False, not {standby!r}")
    if IN_WORKER:
        from .._core._errors import SpawnError

        raise SpawnError(
            "otpmesh.run() was called while a worker imported the controller's main file to find "
            'an actor class; guard the entry point with:\n    if __name__ == "__main__":\n'
            "        otpmesh.run(main)"
        )
    from .._core._errors import StandbyDoneError, SupervisorError

    signals = _Signals()
    pace()
    try:
        return trio.run(_noting_slow_stops, main, args, signals, standby)
    except BaseException as exc:
        done = _gave_up(exc, StandbyDoneError)
        if done is not None:  # a standby whose run ended in order: its job is done too
            print(f"otpmesh: {done}", file=sys.stderr)
            raise SystemExit(0) from None
        gave_up = _gave_up(exc, SupervisorError)
        if gave_up is not None:
            # The tree gave up: its error already says where and why; no traceback pile.
            print(f"otpmesh: {gave_up}", file=sys.stderr)
            raise SystemExit(1) from None
        if isinstance(exc, KeyboardInterrupt) or (
            isinstance(exc, BaseExceptionGroup) and _only_interrupts(exc)
        ):
            if signals.received == signal.SIGTERM:
                print("otpmesh: terminated (SIGTERM), all actors stopped", file=sys.stderr)
                raise SystemExit(TERMINATED_STATUS) from None
            print("otpmesh: interrupted, all actors stopped", file=sys.stderr)
            raise SystemExit(INTERRUPTED_STATUS) from None
        raise


def _gave_up(exc: BaseException, error: type[BaseException]) -> BaseException | None:
    """The `error` (SupervisorError) that `exc` is, or that a group holds with nothing else but
    cancellations (main's nursery around ``otpmesh.start``); None otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        found, rest = exc.split(error)
        left = None if rest is None else rest.split(trio.Cancelled)[1]
        return None if found is None or left is not None else _gave_up(found.exceptions[0], error)
    return exc if isinstance(exc, error) else None


async def _noting_slow_stops(
    main: Callable[..., Awaitable[T]], args: tuple[Any, ...], signals: _Signals, standby: bool
) -> T:
    """`main(*args)` in the main task, as before (Ctrl-C still raises KeyboardInterrupt there,
    and so does SIGTERM); beside it, a system task that hears of either and speaks up when the
    stop is slow."""
    _STANDBY.set(standby)
    interrupted = trio.Event()
    token = trio.lowlevel.current_trio_token()
    trio_handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(trio_handler):
        return await main(*args)  # trio delivers no KeyboardInterrupt here: nothing to note

    def on_stop_signal(signum: int, frame: FrameType | None) -> None:
        if signals.received is None:
            signals.received = signum
        token.run_sync_soon(interrupted.set)  # signal-safe; then trio's own handling
        interrupt(trio_handler, frame)  # not the runtime mid-frame (_owntasks)

    # SIGTERM is the stop a scheduler or `kill` asks for: the same orderly stop as Ctrl-C.
    on_stop_signal.otpmesh_orderly_stop = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, on_stop_signal)
    previous_sigterm = signal.signal(signal.SIGTERM, on_stop_signal)
    try:
        # A system task: cancelled once main is done, and never a nursery around main (which
        # would wrap what main raises in an ExceptionGroup).
        spawn_own(_notice_slow_stop, interrupted, name="otpmesh-stopping")
        return await main(*args)
    finally:
        if signal.getsignal(signal.SIGTERM) is on_stop_signal:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if signal.getsignal(signal.SIGINT) is on_stop_signal:
            signal.signal(
                signal.SIGINT, trio_handler
            )  # trio restores its default only from its own


async def _notice_slow_stop(interrupted: trio.Event) -> None:
    await interrupted.wait()
    since = trio.current_time()
    await trio.sleep(SLOW_STOP_NOTICE)
    stream = sys.stderr  # looked up now: a live view may hold it (and show what is written)
    if not stream.isatty():
        # A line now, and again (at most once a second) whenever the actors waited for change.
        said: list[str] | None = None
        while True:
            paths = waiting_for()
            if paths != said and (paths or said is None):
                print(f"otpmesh: {slow_stop_text(paths)}", file=stream, flush=True)
                said = paths
            await trio.sleep(SLOW_STOP_NOTICE)
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner

    spinner = Spinner("dots", style="yellow")
    console = Console(file=stream, highlight=False)
    # Refreshed here, not by a thread. Live's redirect of stdout would send it to stderr: only
    # when stdout is the terminal too.
    live = Live(
        spinner,
        console=console,
        auto_refresh=False,
        transient=True,
        redirect_stdout=sys.stdout.isatty(),
    )
    with live:
        while True:
            text = slow_stop_text(waiting_for())
            spinner.update(text=f"{text}… {trio.current_time() - since:.0f} s")
            live.refresh()
            await trio.sleep(0.1)
