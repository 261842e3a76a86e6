"""The background run: one process-wide trio run on a daemon thread, for code without trio.

A sync script (``otpmesh.proc_mesh(procs=2).get()``), a notebook cell, or an asyncio program
(``await mesh.ep.call()`` under ``asyncio.run``) has no trio run for otpmesh to live in. The
first such use starts this one; everything made there (the controller runtime, proc meshes,
apps of ``otpmesh.start_background``) lives in it, and every later call from outside trio is
carried to it, so refs made there are used from any thread. One thread, not one per app: a ref
of one app passed to another's actor is the same node's ref.

At interpreter exit the run stops in order: hosted apps first (newest first, each stopping its
tree), then whatever is still in flight is cancelled, and the run ends, which ends the
controller runtime with it (its workers see their controller go and exit: never orphaned).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

import trio

from .._core._errors import AppStoppedError

T = TypeVar("T")

#: How long interpreter exit waits for the background run to stop its apps and end.
EXIT_GRACE = 10.0


class Hosted(Generic[T]):
    """Something the background run holds open (``async with``) until asked to stop: an app of
    ``start_background``. ``started`` gets the value the block yields, ``done`` its end."""

    def __init__(self, name: str, opener: Callable[[], AbstractAsyncContextManager[T]]) -> None:
        self.name = name
        self.opener = opener
        self.started: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.stop: trio.Event | None = None  # made in the run
        self.ended: trio.Event | None = None
        self.opened = trio.Event()

    async def ended_or_started(self) -> None:
        await self.opened.wait()


class DaemonRun:
    """The trio run on the ``otpmesh-background`` thread, and how other threads reach it."""

    def __init__(self) -> None:
        self.token: trio.lowlevel.TrioToken | None = None
        self.started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._calls: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._hosted: list[Hosted[Any]] = []
        self._at_stop: list[Callable[[], Awaitable[object]]] = []
        self.pid = os.getpid()
        # A daemon thread: interpreter exit does not wait for it before atexit runs, and
        # stop_at_exit (registered with atexit) stops it in order.
        self.thread = threading.Thread(target=self._run, name="otpmesh-background", daemon=True)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            self.done.set_exception(exc)
        else:
            self.done.set_result(None)

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as calls:
            self._calls = calls
            self.started.set_result(None)
            await self._stop.wait()
            for hosted in reversed(list(self._hosted)):
                await self._stop_hosted(hosted)
            for stop in reversed(self._at_stop):
                await stop()
            calls.cancel_scope.cancel()

    # ------------------------------------------------------------ from other threads

    def stopped_error(self) -> AppStoppedError:
        return AppStoppedError(
            "otpmesh's background run has ended (the interpreter is exiting, or it failed)"
        )

    def soon(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the background thread soon (a sync function: it must not block)."""
        if self.token is None or self.done.done():
            raise self.stopped_error()
        try:
            self.token.run_sync_soon(fn)
        except trio.RunFinishedError:
            raise self.stopped_error() from None

    def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the background thread, its result back here at once."""
        box: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            try:
                box.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                box.set_exception(exc)

        self.soon(call)
        either: list[concurrent.futures.Future[Any]] = [box, self.done]
        concurrent.futures.wait(either, return_when=concurrent.futures.FIRST_COMPLETED)
        if not box.done():
            raise self.stopped_error()
        return box.result()

    def start(
        self, afn: Callable[[], Awaitable[T]], settle: Callable[[bool, Any], None]
    ) -> trio.CancelScope:
        """Start ``await afn()`` as a task of the background run; `settle(ok, value)` hears its
        end (on the background thread). Cancelling the returned scope cancels it."""
        scope = trio.CancelScope()

        async def task() -> None:
            with scope:
                try:
                    value = await afn()
                except trio.Cancelled:
                    settle(False, self.stopped_error())
                    raise
                except BaseException as exc:
                    settle(False, exc)
                else:
                    settle(True, value)
            if scope.cancelled_caught:
                settle(False, self.stopped_error())

        def spawn() -> None:
            if self._calls is None or self._stop is None or self._stop.is_set():
                settle(False, self.stopped_error())
            else:
                self._calls.start_soon(task)

        self.soon(spawn)
        return scope

    def call(self, afn: Callable[[], Awaitable[T]]) -> T:
        """``await afn()`` in the background run; block this thread until it ends. Ctrl-C here
        cancels it there."""
        box: concurrent.futures.Future[T] = concurrent.futures.Future()

        def settle(ok: bool, value: Any) -> None:
            if not box.done():
                box.set_result(value) if ok else box.set_exception(value)

        scope = self.start(afn, settle)
        try:
            either: list[concurrent.futures.Future[Any]] = [box, self.done]
            concurrent.futures.wait(either, return_when=concurrent.futures.FIRST_COMPLETED)
        except KeyboardInterrupt:
            self._cancel(scope)
            raise
        if not box.done():  # the run ended under it (the interpreter is exiting)
            raise self.stopped_error()
        return box.result()

    async def from_asyncio(self, afn: Callable[[], Awaitable[T]]) -> T:
        """``await afn()`` in the background run, from an asyncio loop of another thread;
        cancelling the awaiting asyncio task cancels it there."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            def land() -> None:
                if not future.done():
                    future.set_result(value) if ok else future.set_exception(value)

            loop.call_soon_threadsafe(land)

        scope = self.start(afn, settle)
        try:
            return await future
        except asyncio.CancelledError:
            self._cancel(scope)
            raise

    def _cancel(self, scope: trio.CancelScope) -> None:
        try:
            self.soon(scope.cancel)
        except AppStoppedError:
            pass  # ended already: nothing left to cancel

    # ------------------------------------------------------------ hosted blocks (apps)

    def at_stop(self, stop: Callable[[], Awaitable[object]]) -> None:
        """In the background run: ``await stop()`` when the run stops, after its hosted blocks,
        newest first (a sync script's proc meshes: their actors' ``on_stop`` runs)."""
        self._at_stop.append(stop)

    async def open(self, hosted: Hosted[T]) -> T:
        """In the background run: open `hosted` there and keep it open until
        ``release(hosted)``; return what its block yields (or raise why it failed to open)."""
        if self._calls is None or trio.lowlevel.current_trio_token() is not self.token:
            raise RuntimeError("DaemonRun.open() runs in the background run itself")
        hosted.stop, hosted.ended = trio.Event(), trio.Event()
        self._hosted.append(hosted)
        self._calls.start_soon(self._hold, hosted, name=hosted.name)
        await hosted.ended_or_started()
        return hosted.started.result()

    async def _hold(self, hosted: Hosted[Any]) -> None:
        assert hosted.stop is not None and hosted.ended is not None  # set by host()
        try:
            async with hosted.opener() as value:
                hosted.started.set_result(value)
                hosted.opened.set()
                await hosted.stop.wait()
        except Exception as exc:  # a tree that gave up: its own failure, not the run's
            if not hosted.started.done():
                hosted.started.set_exception(exc)
            hosted.done.set_exception(exc)
        except BaseException as exc:
            if not hosted.started.done():
                hosted.started.set_exception(self.stopped_error())
            hosted.done.set_exception(self.stopped_error())
            raise exc
        else:
            hosted.done.set_result(None)
        finally:
            self._hosted.remove(hosted)
            hosted.opened.set()
            hosted.ended.set()

    async def _stop_hosted(self, hosted: Hosted[Any]) -> None:
        assert hosted.stop is not None and hosted.ended is not None
        hosted.stop.set()
        await hosted.ended.wait()

    def release(self, hosted: Hosted[Any]) -> None:
        """Ask `hosted` to end its block (it stops in the background; see ``hosted.done``)."""

        def stop() -> None:
            if hosted.stop is not None:
                hosted.stop.set()

        try:
            self.soon(stop)
        except AppStoppedError:
            pass  # the run ended, and the block with it

    def stop_at_exit(self) -> None:
        try:
            self.soon(self._request_stop)
        except AppStoppedError:
            return
        self.thread.join(EXIT_GRACE)

    def _request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()


_lock = threading.Lock()
_daemon: DaemonRun | None = None


def current() -> DaemonRun | None:
    """The background run, if the calling code runs in it."""
    run = _daemon
    if run is None or run.token is None or not trio.lowlevel.in_trio_run():
        return None
    return run if trio.lowlevel.current_trio_token() is run.token else None


def running() -> DaemonRun | None:
    """The process's background run if it is running (none is started here)."""
    run = _daemon
    if run is None or run.done.done() or run.pid != os.getpid():
        return None
    return run


def daemon() -> DaemonRun:
    """The process's background run, started on first use (and stopped at interpreter exit)."""
    global _daemon
    with _lock:
        # A forked child inherits the variable but not the thread: it starts its own.
        if _daemon is None or _daemon.done.done() or _daemon.pid != os.getpid():
            run = DaemonRun()
            run.thread.start()
            run.started.result()
            atexit.register(run.stop_at_exit)
            _daemon = run
        return _daemon
