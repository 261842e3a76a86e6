"""``otpmesh.start_background(tree)``: an app driven from asyncio (a Jupyter kernel's loop,
IPython's top-level ``await``, an asyncio program) or from sync code, living until ``stop()``.

The app runs as ``async with otpmesh.start(tree)`` in otpmesh's background run (``_daemon``:
one trio run on a thread of its own, shared with sync scripts' proc meshes); the caller's loop
is never blocked by it and never runs otpmesh's code. What the caller holds are proxies: every
call is carried to the trio thread (a sync one there and back at once; a call of an actor's
endpoint is a Future, awaited or ``.get()``), so a ref or a mesh is used exactly as inside
``otpmesh.start``: ``await app.actor("nb/greeter").hello("x")``, or ``....hello("x").get()``.
Cancelling the awaiting asyncio task (interrupting the cell) cancels the call in trio.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from .._core._errors import SpawnError
from .._core._spec import Mesh, Supervisor
from .._node._daemon import DaemonRun, Hosted, daemon
from .._node._future import Future, later
from .._node._mesh import ActorMesh, ActorRef, Endpoint
from .._runtime import _run
from ._app import App, start
from ._events import EventLog


async def _awaited(run: DaemonRun, coro: Awaitable[Any]) -> Any:
    return _wrap(run, await coro)


async def _in_trio(run: DaemonRun, coro: Awaitable[Any]) -> Any:
    """Await `coro` (a trio coroutine) in the background run; cancelling the caller cancels it."""

    async def awaited() -> Any:
        return _wrap(run, await coro)

    return await run.from_asyncio(awaited)


class Remote:
    """A trio-side object (an app, a ref, a mesh, an endpoint) used from asyncio: attributes and
    items come back as proxies, sync calls run on the trio thread, coroutines become asyncio
    awaitables and async iterators asyncio ones."""

    __slots__ = ("_runner", "_target")

    def __init__(self, runner: DaemonRun, target: Any) -> None:
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
    def __init__(self, runner: DaemonRun, agen: Any) -> None:
        self._runner, self._agen = runner, agen

    def __aiter__(self) -> _AsyncIterator:
        return self

    async def __anext__(self) -> Any:
        return await _in_trio(self._runner, self._agen.__anext__())

    async def aclose(self) -> None:
        await _in_trio(self._runner, self._agen.aclose())


def _wrap(runner: DaemonRun, value: Any) -> Any:
    if inspect.iscoroutine(value):  # an App method's: a Future, for await and .get() alike
        return later(value.__qualname__, _awaited, runner, value)
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
    """A running app driven from asyncio or sync code: ``app.actor(path)``, ``app.mesh(path)``,
    ``await app.settled()``, ``app.events`` and every other ``App`` method, as inside
    ``otpmesh.start``; ``app.stop()`` stops it (children in reverse start order)."""

    __slots__ = ("_hosted",)

    def __init__(self, runner: DaemonRun, hosted: Hosted[App]) -> None:
        super().__init__(runner, hosted.started.result())
        self._hosted = hosted

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Future[Any]:
        """``fn(*args, **kwargs)`` awaited in the app's trio run, for trio code such as
        ``await app.run(otpmesh.retry, app.actor("nb/g").hello, "x")`` (or ``.get()``)."""
        args, kwargs = _unwrap(args), _unwrap(kwargs)
        return later(getattr(fn, "__name__", "run"), fn, *args, **kwargs)

    def stop(self) -> Future[None]:
        """Stop the tree; the Future ends when it has stopped, raising its failure if it gave up
        (SupervisorError)."""
        self._runner.release(self._hosted)
        return later("stopping the app", _finished, self._hosted)

    @property
    def running(self) -> bool:
        """Whether the app still runs (False once stopped, or once its root gave up)."""
        return not self._hosted.done.done()


async def _finished(hosted: Hosted[App]) -> None:
    """Wait (in the background run) until `hosted` has ended; raise its failure."""
    if hosted.ended is not None:
        await hosted.ended.wait()
    exc = hosted.done.exception()
    if exc is not None:
        raise exc


def start_background(tree: Supervisor | Mesh, **options: Any) -> Future[BackgroundApp]:
    """Start `tree` in otpmesh's background run (a trio thread) and return it, for asyncio or
    sync code: a notebook (``app = await otpmesh.start_background(tree)`` in one cell, calls
    in the next ones), an asyncio program, or a script (``otpmesh.start_background(tree)
    .get()``). Takes ``otpmesh.start``'s options. Stop it with ``app.stop()`` (a Future); at
    interpreter exit one still running is stopped too, newest first."""
    if not isinstance(tree, Supervisor | Mesh):
        raise TypeError(f"otpmesh.start_background needs a Supervisor or Mesh spec, not {tree!r}")
    if _run.IN_WORKER:
        raise SpawnError(
            "otpmesh.start_background() was called while a worker imported the controller's "
            "main file to find an actor class; guard the entry point with:\n"
            '    if __name__ == "__main__":'
        )
    return later(f"starting {tree.id}", _start_background, tree, options)


async def _start_background(tree: Supervisor | Mesh, options: dict[str, Any]) -> BackgroundApp:
    run = daemon()
    if trio.lowlevel.current_trio_token() is not run.token:
        raise SpawnError(
            f"otpmesh.start_background({tree.id!r}) is for asyncio and sync code; in a trio "
            "run, use: async with otpmesh.start(tree) as app: ..."
        )
    hosted = Hosted(f"otpmesh-app-{tree.id}", partial(start, tree, **options))
    await run.open(hosted)
    return BackgroundApp(run, hosted)
