"""Future: what a call returns, awaited from any loop or waited for from plain threads.

A Future is lazy, like the coroutine it replaces: nothing is sent until it is awaited or
``.get()`` is called. Where it is awaited decides where it runs:

- in a trio run (an actor, ``otpmesh.run``): right there, as a plain coroutine would (no task,
  no thread: the hot path);
- in an asyncio actor's code: carried to its process's trio run (``_aioloop.bridge``);
- in any other asyncio loop (``asyncio.run``, a notebook): in the background run
  (``_daemon``), its result back through an asyncio future.

``.get()`` blocks the calling thread instead: from a script, a notebook cell, or a worker thread
of a trio run (an ``@endpoint(blocking=True)``), which reaches its run with
``trio.from_thread.run``. From a trio run's own thread it refuses at once: blocking there would
stop the very loop the answer needs.

One Future, one result (as Monarch's): once it has ended, awaiting it again or calling ``.get()``
returns the same value or raises the same error, and nothing is sent again. A Future that was
cancelled before it ended may be awaited again (it is sent again).

Nothing vanishes in silence: a Future dropped without ever being awaited, passed to ``gather``
or ``.get()`` (``calc[0].add(1)`` without ``await``) sent nothing, and says so as Python does
for a coroutine never awaited: a RuntimeWarning naming the call, at the line that dropped it
(for a call written as a statement, the line that made it).

It is a ``collections.abc.Coroutine`` too, so ``nursery.start_soon(mesh.ep.call, x)`` and
``asyncio.create_task(mesh.ep.call(x))`` take it as they take a coroutine.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator
from functools import partial
from typing import Any, TypeVar

import trio

from .._core._errors import CallTimeoutError, MeshError
from ._aioloop import bridge
from ._daemon import daemon

T = TypeVar("T")

#: What `.get()` from a trio thread says.
GET_IN_TRIO = (
    "Future.get() blocks its thread, and this thread runs a trio loop (an actor, or "
    "otpmesh.run): the reply could never arrive. Use 'await', or mark the endpoint "
    "@endpoint(blocking=True) so it runs in a worker thread where .get() may block"
)


# A Future's states: not sent yet, in flight, ended with a value, ended with an error; and
# cancelled before it ended, or refused with an error that said why (it may be awaited again,
# like a new one, but its caller knows it did not end).
_NEW, _BUSY, _OK, _ERROR = range(4)
_AGAIN = -1
#: otpmesh's own directory: a call's origin is the first frame outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Where "never awaited" was said already (one warning per line and call, as warnings do).
_SAID: dict[Any, Any] = {}


class Future(Coroutine[Any, Any, T]):
    """A call's result to come: ``await fut`` (trio, asyncio) or ``fut.get(timeout=None)`` (a
    blocking wait, for scripts, notebooks and blocking endpoints)."""

    # Few objects per call: the pipelined hot path keeps thousands alive at once, and every
    # one of them is traversed by the garbage collector while it lives.
    __slots__ = ("_args", "_it", "_start", "_state", "_value")

    def __init__(self, start: Callable[..., Awaitable[T]], *args: Any) -> None:
        # start(*args, timeout) makes the coroutine that does the work; timeout None: its own.
        self._start = start
        self._args = args
        self._state = _NEW
        self._value: Any = None
        self._it: Generator[Any, Any, T] | None = None  # only when driven by send()

    def __del__(self) -> None:
        if self._state == _NEW:
            try:
                _never_sent(self)
            except Exception:  # interpreter shutdown (modules torn down), or -W error
                if sys is not None and sys.meta_path is not None:  # not shutting down: say it
                    raise

    # ------------------------------------------------------------ await

    def __await__(self) -> Generator[Any, Any, T]:
        if self._state < _OK:
            self._claim()
            try:
                if trio.lowlevel.in_trio_task():
                    value = yield from self._start(*self._args, None).__await__()
                else:
                    aio = bridge()
                    if aio is not None:  # an asyncio actor: the call itself runs in its trio run
                        value = yield from aio.to_trio(self._start, *self._args, None).__await__()
                    else:
                        run = daemon().from_asyncio(partial(self._start, *self._args, None))
                        value = yield from run.__await__()
            except Exception as exc:
                self._settle(_ERROR, exc)
            except BaseException:
                self._state = _AGAIN  # cancelled or interrupted: no result; may be awaited again
                raise
            else:
                self._settle(_OK, value)
        return self._result()

    # ------------------------------------------------------------ get

    def get(self, timeout: float | None = None) -> T:
        """Wait for the result, blocking this thread; `timeout` (seconds) raises
        CallTimeoutError as ``with_timeout`` does. Not from a trio run's own thread (use await)."""
        if self._state < _OK:
            if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
                raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
            if trio.lowlevel.in_trio_run():
                self._told()
                raise MeshError(GET_IN_TRIO)
            if bridge() is not None:
                self._told()
                raise MeshError(
                    "Future.get() would block this asyncio actor's event loop: use 'await', "
                    "or mark the endpoint @endpoint(blocking=True)"
                )
            self._claim()
            try:
                if _in_trio_worker_thread():
                    value = trio.from_thread.run(partial(self._start, *self._args, timeout))
                else:
                    value = daemon().call(partial(self._start, *self._args, timeout))
            except Exception as exc:
                self._settle(_ERROR, exc)
            except BaseException:
                self._state = _AGAIN
                raise
            else:
                self._settle(_OK, value)
        return self._result()

    def done(self) -> bool:
        """Whether it has ended (awaiting it or ``get()`` then returns at once)."""
        return self._state >= _OK

    # ------------------------------------------------------------ the Coroutine protocol

    # asyncio.create_task drives it with send/throw (trio awaits it from a coroutine of its own).
    def send(self, value: Any) -> Any:
        if self._it is None:
            self._it = self.__await__()
        return self._it.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._it is None:
            self._it = self.__await__()
        if val is None and tb is None:
            return self._it.throw(typ)
        return self._it.throw(typ, val, tb)  # pragma: no cover - the old three-argument form

    def close(self) -> None:
        if self._it is not None:
            self._it.close()

    # ------------------------------------------------------------ its one result

    def _told(self) -> None:
        """Its caller was told why it was not sent (no "never awaited" warning for it)."""
        if self._state == _NEW:
            self._state = _AGAIN

    def _claim(self) -> None:
        if self._state == _BUSY:
            raise MeshError(
                "this Future is being awaited already: await it in one place and share the "
                "value (awaiting it again after it ends returns the same result)"
            )
        self._state = _BUSY

    def _settle(self, state: int, value: Any) -> None:
        self._state, self._value, self._it = state, value, None

    def _result(self) -> T:
        if self._state == _OK:
            result: T = self._value
            return result
        raise self._value

    def __repr__(self) -> str:
        state = ("not sent", "running", "done", "failed", "not ended")[self._state]
        return f"<otpmesh.Future {state}: {_what(self)}>"


# ------------------------------------------------------------ for gather (_gather.py)


def take(fut: Future[Any]) -> tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]] | None:
    """Claim a Future not sent yet, for ``gather`` to send its call itself: the start and
    arguments it was made with; None when it has ended or is being awaited elsewhere."""
    if fut._state not in (_NEW, _AGAIN):
        return None
    fut._state = _BUSY
    return fut._start, fut._args


def give_back(fut: Future[Any], *, sent: bool = True) -> None:
    """A Future `take` claimed was cancelled (`sent`) or not sent after all: it may be
    awaited."""
    fut._state = _AGAIN if sent else _NEW


def settle(fut: Future[Any], ok: bool, value: Any) -> None:
    """End a Future `take` claimed with the outcome gather got for it."""
    fut._settle(_OK if ok else _ERROR, value)


def outcome(fut: Future[Any]) -> tuple[bool, Any]:
    """The (ok, value-or-error) of a Future that has ended."""
    return fut._state == _OK, fut._value


def _in_trio_worker_thread() -> bool:
    """Whether this thread was started by a trio run (``trio.to_thread``), which it can reach."""
    try:
        trio.from_thread.check_cancelled()
    except RuntimeError:
        return False
    return True


def later(label: str, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Future[T]:
    """A Future that awaits ``fn(*args, **kwargs)``; a ``get(timeout)`` past its time raises
    CallTimeoutError naming `label`."""
    return Future(_within, label, fn, args, kwargs)


async def _within(
    label: str, fn: Callable[..., Awaitable[T]], args: Any, kwargs: Any, timeout: float | None
) -> T:
    if timeout is None:
        return await fn(*args, **kwargs)
    with trio.move_on_after(timeout):
        return await fn(*args, **kwargs)
    raise CallTimeoutError([], label, timeout)


def _dropped_at() -> tuple[str, int]:
    """The file and line of the code outside otpmesh running now, where a Future is being
    dropped: for ``calc[0].add(1)`` written as a statement, the line that made the call (as
    for Python's own "never awaited": no cost until it is said)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
    return ("<unknown>", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def _what(fut: Future[Any]) -> str:
    """The call a Future stands for, as the user wrote it: ``calc/0.add(...)``."""
    first = fut._args[0] if fut._args else None
    if isinstance(first, str):  # later(label, ...)
        return first
    if isinstance(first, list):
        return f"otpmesh.gather({len(first)} calls)"
    if first is not None and type(first).__name__ == "Endpoint":
        kind = getattr(fut._args[1], "__name__", "").lstrip("_")
        return f"{first!r}{'.' + kind if kind in ('broadcast', 'choose') else ''}(...)"
    return str(getattr(fut._start, "__qualname__", fut._start))


def _never_sent(fut: Future[Any]) -> None:
    origin = _dropped_at()
    warnings.warn_explicit(
        f"otpmesh: the call {_what(fut)} was never awaited, so it was never sent: "
        "'await' it (or call .get() from synchronous code); otpmesh.gather(...) sends many",
        RuntimeWarning,
        origin[0],
        origin[1],
        registry=_SAID,
    )
