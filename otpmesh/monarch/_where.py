"""Where otpmesh.monarch's operations run, and in what order.

Every operation (a call, a spawn, a stop) is a trio task in the run of this process's otpmesh
node, started when the operation is asked for (Monarch's calls are sent at once, awaited or
not). Which run that is depends on the calling code:

- trio code of a run with a node (the controller's, a worker's): that run;
- a Monarch actor's code, on its process's asyncio thread (``_aioloop``): the run beside it;
- a worker thread of a trio run (``trio.to_thread``): that run;
- anything else (a plain script, ``asyncio.run``, a notebook): otpmesh's background run
  (``_node/_daemon.py``), a trio run on a daemon thread, started on first use and stopped in
  order at exit (its worker processes never outlive the program).

Operations started from one thread reach the wire in the order they were asked for, as
Monarch promises (FIFO per sender): each task waits until the one before it has started, and
otpmesh sends a call before its first checkpoint once the target's connection is up.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from .._core._errors import AppStoppedError
from .._node._aioloop import bridge
from .._node._daemon import daemon, running
from .._wire._owntasks import spawn as spawn_own
from ._future import Future, settled

T = TypeVar("T")


class Run:
    """One trio run that monarch operations start tasks in."""

    __slots__ = ("last", "thread", "token")

    def __init__(self, token: trio.lowlevel.TrioToken, thread: int) -> None:
        self.token = token
        self.thread = thread
        self.last: trio.Event | None = None  # the latest task's "started" (FIFO order)


_RUN: trio.lowlevel.RunVar[Run] = trio.lowlevel.RunVar("otpmesh_monarch_run")


def _this_run() -> Run:
    """The Run of the trio run the caller is in (its thread)."""
    try:
        return _RUN.get()
    except LookupError:
        run = Run(trio.lowlevel.current_trio_token(), threading.get_ident())
        _RUN.set(run)
        return run


def in_trio() -> bool:
    """Whether the caller runs in a trio task."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def start(
    fn: Callable[..., Awaitable[T]], *args: Any, token: trio.lowlevel.TrioToken | None = None
) -> Future[T]:
    """Start ``fn(ready, *args)`` now as a task in the right trio run (see the module's
    docstring), in the caller's context (its actor, its call chain: deadlocks are still
    refused); return the Future of its result. `fn` calls ``ready()`` once nothing it still
    has to wait for (a mesh being spawned, a connection) stands before its send: the next
    operation from this run starts only then. `token` is `run_token()` when the caller has it
    already (then nothing here blocks: safe under a lock)."""
    context = contextvars.copy_context()
    if in_trio():
        run = _this_run()
        future: Future[T] = Future(run.thread)
        _spawn(run, future, fn, args, context)
        return future
    token = token or run_token()
    future = Future(0)  # its owner (the run's thread) is set when the run takes it on

    def spawn() -> None:
        run = _this_run()
        future.owned_by(run.thread)
        _spawn(run, future, fn, args, context)

    try:
        token.run_sync_soon(spawn)
    except trio.RunFinishedError:
        raise AppStoppedError("otpmesh's runtime in this process has stopped") from None
    return future


def run_token() -> trio.lowlevel.TrioToken:
    """The trio run that operations asked for here run in (see the module's docstring)."""
    if in_trio():
        return trio.lowlevel.current_trio_token()
    aio = bridge()
    if aio is not None:
        return aio.token
    try:  # a worker thread of a trio run
        return trio.from_thread.run_sync(trio.lowlevel.current_trio_token)
    except RuntimeError:
        token = daemon().token
        if token is None:  # pragma: no cover - set before daemon() returns
            raise AppStoppedError("otpmesh's background run has stopped") from None
        return token


def _spawn(
    run: Run,
    future: Future[T],
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    context: contextvars.Context,
) -> None:
    before, started = run.last, trio.Event()
    run.last = started

    async def task() -> None:
        try:
            if before is not None and not before.is_set():
                await before.wait()
            value = await fn(started.set, *args)
        except BaseException as exc:  # its caller gets it, whatever it is
            if isinstance(exc, trio.Cancelled):
                future._settle(None, AppStoppedError("otpmesh's runtime stopped first"))
            else:
                future._settle(None, exc)
            return
        finally:
            started.set()
        future._settle(value, None)

    spawn_own(task, name=f"otpmesh.monarch:{fn!r}", context=context)


def shutdown_context() -> Future[None]:
    """Monarch's ``shutdown_context()``: stop what this program started from code outside any
    event loop of otpmesh's (a script, asyncio, a notebook): its background run, and with it
    every worker process it spawned, as at exit. A later operation starts a fresh one."""
    if in_trio():
        raise RuntimeError(
            "shutdown_context() stops the background runtime of a script or asyncio program; "
            "trio code owns its runtime: it stops when its 'trio.run' (or otpmesh.run) ends"
        )
    run = running()
    if run is not None:
        run.stop_at_exit()
    return settled(None)
