"""asyncio inside actors: where the async code of an actor declared with ``loop="asyncio"`` runs.

trio stays the runtime's loop: it reads and writes every connection, runs the mailboxes and
the plain trio actors, unchanged. Beside it, a process with asyncio actors runs one asyncio
event loop in its own thread (``otpmesh-asyncio``, started with the first such actor, ended
with the trio run). The actor's cell, a trio task, still takes one message at a time; for
each it starts the endpoint's coroutine as an asyncio task there and waits for it:

- a cancel in trio (the caller gave up, a progress deadline, a stop) cancels the asyncio task,
  and the cell waits for that task to end before the next message (the mailbox stays serial);
- the stacks of such an actor are its asyncio task's awaits (``Serving.aio_task``);
- calls such code makes to other actors go back through trio (``bridge``, used by
  ``_mesh.Endpoint``), with the caller's context, so deadlocks are still refused.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import outcome
import trio

from .._wire._owntasks import spawn as spawn_own

T = TypeVar("T")

log = logging.getLogger("otpmesh.actor")

#: The name of the asyncio thread (its stack is left out of a process's while it waits idle).
THREAD_NAME = "otpmesh-asyncio"


class _Local(threading.local):
    # The asyncio thread the current thread is, set in that thread only. A class default:
    # read on every call an actor makes, it must cost no failed lookup.
    thread: AsyncioThread | None = None


_local = _Local()
_THREAD: trio.lowlevel.RunVar[AsyncioThread] = trio.lowlevel.RunVar("otpmesh_asyncio")


def asyncio_thread() -> AsyncioThread:
    """This trio run's asyncio thread, started on first use."""
    try:
        return _THREAD.get()
    except LookupError:
        thread = AsyncioThread(trio.lowlevel.current_trio_token())
        _THREAD.set(thread)
        # Ends the loop when the trio run ends (system tasks are cancelled then).
        spawn_own(thread.serve, name="otpmesh-asyncio-guard")
        return thread


def bridge() -> AsyncioThread | None:
    """The asyncio thread the calling code runs in, or None outside one (trio, or a thread of
    the user's own)."""
    return _local.thread


def lend(thread: AsyncioThread) -> None:
    """Make the calling thread, one that runs an asyncio actor's plain code beside the loop
    (``otpmesh.monarch``'s sync actors), call other actors as `thread`'s code does: through its
    trio run. It runs no loop: it may block on a result while the loop serves on."""
    _local.thread = thread


class AsyncioThread:
    """One asyncio event loop in a thread of its own, beside a trio run (`token`)."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        """The trio run this loop sits beside (where calls from its code are made)."""
        return self._token

    @property
    def ident(self) -> int | None:
        """The thread's identifier (where a stack of its code is read)."""
        return self._thread.ident

    def _run(self) -> None:
        _local.thread = self
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def serve(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

    # ------------------------------------------------------------ trio -> asyncio

    async def run(
        self,
        coro: Coroutine[Any, Any, T],
        context: contextvars.Context,
        started: Callable[[asyncio.Task[T]], None] | None = None,
    ) -> T:
        """Run `coro` as an asyncio task in `context`; wait for it in trio. `started` hears of
        the task (in the asyncio thread). Cancelled in trio, the task is cancelled and waited
        for; a task that ends cancelled by itself raises ``AsyncioCancelled``."""
        done = trio.Event()
        token = self._token
        box: list[asyncio.Task[T]] = []

        def wake(_: object) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        def start() -> None:
            task = self.loop.create_task(coro, context=context)
            box.append(task)
            if started is not None:
                started(task)
            task.add_done_callback(wake)

        def cancel() -> None:
            box[0].cancel()  # start() ran first: the loop runs its callbacks in order

        self.loop.call_soon_threadsafe(start)
        try:
            await done.wait()
        except trio.Cancelled:
            self.loop.call_soon_threadsafe(cancel)
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        task = box[0]
        if task.cancelled():
            raise AsyncioCancelled("the endpoint's asyncio task was cancelled from asyncio")
        return task.result()

    # ------------------------------------------------------------ asyncio -> trio

    def call_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """From this thread: ``fn(*args)`` run in trio, waited for (a quick synchronous
        operation on trio's side, such as registering a port: the asyncio loop waits for it)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """From this thread: run ``fn(*args)`` in trio soon, without waiting for it (its
        errors are logged: nobody waits to hear of them)."""

        def run() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("%r, run in trio for asyncio code, failed", fn)

        self._token.run_sync_soon(run)

    async def to_trio(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """From this thread's asyncio code: await `fn(*args, **kwargs)` run in trio, in the
        calling context. Cancelling the asyncio side cancels the trio side."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()
        scopes: list[trio.CancelScope] = []

        def settle(result: outcome.Outcome[T] | None) -> None:
            if future.done():
                return
            if result is None or isinstance(getattr(result, "error", None), trio.Cancelled):
                future.cancel()
            else:
                try:
                    future.set_result(result.unwrap())
                except BaseException as exc:  # the call's error, raised in the caller
                    future.set_exception(exc)

        async def in_trio() -> None:
            result: outcome.Outcome[T] | None = None
            try:
                with trio.CancelScope() as scope:
                    scopes.append(scope)
                    result = await outcome.acapture(fn, *args, **kwargs)
            finally:
                loop.call_soon_threadsafe(settle, result)

        def spawn() -> None:
            spawn_own(in_trio, name=f"otpmesh-from-asyncio:{fn!r}", context=context)

        def cancel() -> None:
            if scopes:
                scopes[0].cancel()

        self._token.run_sync_soon(spawn)
        try:
            return await future
        except asyncio.CancelledError:
            self._token.run_sync_soon(cancel)
            raise


class AsyncioCancelled(Exception):
    """An asyncio actor's task ended cancelled though nothing in otpmesh cancelled it."""


#: Added to the crash of a trio actor whose endpoint used asyncio.
ASYNCIO_HINT = (
    "otpmesh: this actor's endpoints run on trio; to await asyncio code in them, declare the "
    'class with loop="asyncio": class MyActor(otpmesh.Actor, loop="asyncio")'
)


def needs_asyncio(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "no running event loop" in str(exc)
