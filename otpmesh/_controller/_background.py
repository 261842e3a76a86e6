"""``await otpmesh.start_background(tree)``: an app driven from asyncio (a Jupyter kernel's loop,
IPython's top-level ``await``, an asyncio program), living across cells until ``stop()``.

The app runs as ``async with otpmesh.start(tree)`` in a trio run on a thread of its own; the
caller's asyncio loop is never blocked by it and never runs otpmesh's code. What the caller holds
are proxies: every call is carried to the trio thread (a sync one there and back at once, an
async one as a task whose result comes back through an asyncio future), so a ref or a mesh is
used exactly as inside ``otpmesh.start``: ``await app.actor("nb/greeter").hello("x")``.
Cancelling the awaiting asyncio task (interrupting the cell) cancels the call in trio.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._core._errors import AppStoppedError, SpawnError
from .._core._spec import Mesh, Supervisor
from .._node._mesh import ActorMesh, ActorRef, Endpoint
from .._runtime import _run
from ._app import App, start
from ._events import EventLog

#: How long interpreter exit waits for a background app still running to stop.
EXIT_GRACE = 10.0


class _Runner:
    """The trio thread: starts the tree, runs calls in a nursery inside the app's block, and
    stops when asked (or when the tree gives up)."""

    def __init__(self, tree: Supervisor | Mesh, options: dict[str, Any]) -> None:
        self.tree, self.options = tree, options
        self.started: concurrent.futures.Future[App] = concurrent.futures.Future()
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.token: trio.lowlevel.TrioToken | None = None
        self.calls: trio.Nursery | None = None
        self._stop = trio.Event()
        # A daemon thread: interpreter exit does not wait for it before atexit runs, and the
        # atexit hook below stops the app in order (workers never outlive us anyway).
        self.thread = threading.Thread(target=self._run, name=f"otpmesh-{tree.id}", daemon=True)

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
        async with start(self.tree, **self.options) as app:
            async with trio.open_nursery() as calls:
                self.calls = calls
                self.started.set_result(app)
                await self._stop.wait()
                calls.cancel_scope.cancel()

    def stopped_error(self) -> BaseException:
        """What a call met by the app's end raises: the app's failure, if it failed."""
        if self.done.done() and self.done.exception() is not None:
            return AppStoppedError(f"the app {self.tree.id} stopped: {self.done.exception()}")
        return AppStoppedError(f"the app {self.tree.id} has stopped")

    def run_sync(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the trio thread, its result back here (at once: it is a
        sync call, which may return a coroutine to await later)."""
        box: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            try:
                box.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                box.set_exception(exc)

        self.soon(call)
        concurrent.futures.wait([box, self.done], return_when=concurrent.futures.FIRST_COMPLETED)
        if not box.done():
            raise self.stopped_error()
        return box.result()

    def soon(self, fn: Callable[[], object]) -> None:
        if self.token is None:
            raise self.stopped_error()
        try:
            self.token.run_sync_soon(fn)
        except trio.RunFinishedError:
            raise self.stopped_error() from None

    def stop_at_exit(self) -> None:
        self.request_stop()
        self.thread.join(EXIT_GRACE)

    def request_stop(self) -> None:
        try:
            self.soon(self._stop.set)
        except AppStoppedError:
            pass  # already stopped


async def _in_trio(runner: _Runner, coro: Awaitable[Any]) -> Any:
    """Await `coro` (a trio coroutine) on the trio thread; cancelling the caller cancels it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    scope = trio.CancelScope()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    async def task() -> None:
        with scope:
            try:
                value = _wrap(runner, await coro)
            except trio.Cancelled:
                loop.call_soon_threadsafe(settle, False, runner.stopped_error())
                raise  # ours (the caller cancelled: its future is done already) or the app's
            except BaseException as exc:
                loop.call_soon_threadsafe(settle, False, exc)
            else:
                loop.call_soon_threadsafe(settle, True, value)

    def spawn() -> None:
        if runner.calls is None or runner.done.done():
            loop.call_soon_threadsafe(settle, False, runner.stopped_error())
            coro.close()  # type: ignore[attr-defined]
        else:
            runner.calls.start_soon(task)

    runner.soon(spawn)
    try:
        return await future
    except asyncio.CancelledError:
        try:
            runner.soon(scope.cancel)
        except AppStoppedError:
            pass
        raise


class Remote:
    """A trio-side object (an app, a ref, a mesh, an endpoint) used from asyncio: attributes and
    items come back as proxies, sync calls run on the trio thread, coroutines become asyncio
    awaitables and async iterators asyncio ones."""

    __slots__ = ("_runner", "_target")

    def __init__(self, runner: _Runner, target: Any) -> None:
        self._runner, self._target = runner, target

    def __getattr__(self, name: str) -> Any:
        return _wrap(self._runner, self._runner.run_sync(getattr, self._target, name))

    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._runner, self._runner.run_sync(lambda: self._target[key]))

    def __len__(self) -> int:
        return int(self._runner.run_sync(len, self._target))

    def __iter__(self) -> Any:
        return iter([_wrap(self._runner, v) for v in self._runner.run_sync(list, self._target)])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _unwrap(args), _unwrap(kwargs)
        return _wrap(self._runner, self._runner.run_sync(self._target, *args, **kwargs))

    def __repr__(self) -> str:
        return f"<from asyncio: {self._target!r}>"


class _AsyncIterator:
    def __init__(self, runner: _Runner, agen: Any) -> None:
        self._runner, self._agen = runner, agen

    def __aiter__(self) -> _AsyncIterator:
        return self

    async def __anext__(self) -> Any:
        return await _in_trio(self._runner, self._agen.__anext__())

    async def aclose(self) -> None:
        await _in_trio(self._runner, self._agen.aclose())


def _wrap(runner: _Runner, value: Any) -> Any:
    if inspect.iscoroutine(value):
        return _in_trio(runner, value)
    if inspect.isasyncgen(value):
        return _AsyncIterator(runner, value)
    if isinstance(value, ActorRef | ActorMesh | Endpoint | EventLog) or inspect.ismethod(value):
        return Remote(runner, value)
    return value


def _unwrap(value: Any) -> Any:
    """Arguments as the trio side knows them: a proxy passed back is its target."""
    if isinstance(value, Remote):
        return value._target
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


class BackgroundApp(Remote):
    """A running app driven from asyncio: ``app.actor(path)``, ``app.mesh(path)``,
    ``await app.settled()``, ``app.events`` and every other ``App`` method, as inside
    ``otpmesh.start``; ``await app.stop()`` stops it (children in reverse start order)."""

    __slots__ = ()

    async def run(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """``await fn(*args, **kwargs)`` on the app's trio thread: for trio code, such as
        ``await app.run(otpmesh.retry, app.actor("nb/g").hello, "x")``."""
        args, kwargs = _unwrap(args), _unwrap(kwargs)
        return await _in_trio(self._runner, self._runner.run_sync(fn, *args, **kwargs))

    async def stop(self) -> None:
        """Stop the tree and wait for it; raise its failure if it gave up (SupervisorError)."""
        self._runner.request_stop()
        atexit.unregister(self._runner.stop_at_exit)
        await asyncio.wrap_future(self._runner.done)

    @property
    def running(self) -> bool:
        """Whether the app still runs (False once stopped, or once its root gave up)."""
        return not self._runner.done.done()


async def start_background(tree: Supervisor | Mesh, **options: Any) -> BackgroundApp:
    """Start `tree` on a trio thread of its own and return it, for asyncio code: a notebook
    (``app = await otpmesh.start_background(tree)`` in one cell, calls in the next ones) or an
    asyncio program. Takes ``otpmesh.start``'s options. Stop it with ``await app.stop()``; at
    interpreter exit one still running is stopped too."""
    if not isinstance(tree, Supervisor | Mesh):
        raise TypeError(f"otpmesh.start_background needs a Supervisor or Mesh spec, not {tree!r}")
    if _run.IN_WORKER:
        raise SpawnError(
            "otpmesh.start_background() was called while a worker imported the controller's "
            "main file to find an actor class; guard the entry point with:\n"
            '    if __name__ == "__main__":'
        )
    runner = _Runner(tree, options)
    runner.thread.start()
    await asyncio.wrap_future(runner.started)
    atexit.register(runner.stop_at_exit)
    return BackgroundApp(runner, runner.started.result())
