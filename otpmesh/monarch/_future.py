"""Monarch's ``Future``: the result of an operation already under way, read with ``await`` (in
trio or asyncio) or ``.get()`` (from code with no event loop, or from a Monarch actor's code,
which runs on its asyncio thread while trio carries the call).

The operation is a task in the trio run of this process's otpmesh node (``_where.py``); it
settles the future from that run's thread, and each waiter is woken on its own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

import trio

from ._ending import take_ending

R = TypeVar("R")


class Future(Generic[R]):
    """The result of a Monarch-style operation (a call, a spawn, a stop), already started.

    ``await fut`` in trio or asyncio code; ``fut.get(timeout=None)`` from sync code. The result
    is kept: awaiting again, or ``get()`` after ``await``, returns it (or raises its error) again.
    """

    __slots__ = ("_done", "_error", "_lock", "_owner", "_value", "_waiters")

    def __init__(self, owner: int) -> None:
        # `owner`: the thread id of the trio run doing the work (get() there would block it).
        self._owner = owner
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiters: list[Callable[[], None]] = []

    @property
    def owner(self) -> int:
        """The thread id of the trio run that settles this future."""
        return self._owner

    def owned_by(self, thread: int) -> None:
        """Say which thread's trio run settles this future (set once that run takes it on)."""
        self._owner = thread

    # ------------------------------------------------------------ settled by the trio task

    def _settle(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._value, self._error = value, error
            self._done.set()
            waiters, self._waiters = self._waiters, []
        for wake in waiters:
            wake()

    def _on_done(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from the settling thread) once the result is in; at once if it is."""
        with self._lock:
            if not self._done.is_set():
                self._waiters.append(wake)
                return
        wake()

    def _result(self) -> R:
        if self._error is not None:
            raise self._error
        value: R = self._value
        return value

    # ------------------------------------------------------------ read by the caller

    def done(self) -> bool:
        """Whether the result (or error) is in."""
        return self._done.is_set()

    def get(self, timeout: float | None = None) -> R:
        """Block this thread until the result is in; return it or raise its error.
        ``TimeoutError`` after `timeout` seconds (the operation goes on; ask again later).
        ``SystemExit`` when an unhandled fault ends the program meanwhile (``_ending.py``)."""
        try:
            return self._get(timeout)
        except KeyboardInterrupt:
            status = take_ending()
            if status is None:
                raise  # Ctrl-C
            raise SystemExit(status) from None  # the fault said why, on one line

    def _get(self, timeout: float | None) -> R:
        if not self._done.is_set():
            if threading.get_ident() == self._owner:
                raise RuntimeError(
                    "Future.get() on the thread of the trio run doing the work would block it "
                    "for ever: use 'await fut' in async code"
                )
            if timeout is not None and not timeout >= 0:
                raise ValueError(f"timeout must be a non-negative number of seconds: {timeout!r}")
            if not self._done.wait(timeout):
                raise TimeoutError(f"the operation did not finish within {timeout} s")
        return self._result()

    def __await__(self) -> Generator[Any, None, R]:
        return self._wait().__await__()

    async def as_asyncio(self) -> R:
        """The result, awaited on the running asyncio loop (Monarch's spelling of ``await``)."""
        return await self._wait_asyncio()

    async def _wait(self) -> R:
        if not self._done.is_set():
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                await self._wait_trio()
            else:
                await self._wait_asyncio()
        return self._result()

    async def _wait_trio(self) -> None:
        if not self._done.is_set():
            event = trio.Event()
            if threading.get_ident() == self._owner:
                self._on_done(event.set)
            else:  # a future of another trio run (the client runtime's): woken through its token
                token = trio.lowlevel.current_trio_token()
                self._on_done(lambda: _soon(token, event.set))
            await event.wait()

    async def _wait_asyncio(self) -> R:
        if not self._done.is_set():
            loop = asyncio.get_running_loop()
            box: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not box.done():
                    box.set_result(None)

            self._on_done(lambda: _call_soon(loop, wake))
            await box
        return self._result()

    def __repr__(self) -> str:
        if not self._done.is_set():
            return "<Future pending>"
        return f"<Future {'error ' + repr(self._error) if self._error else repr(self._value)}>"


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    loop.call_soon_threadsafe(fn)


def _soon(token: trio.lowlevel.TrioToken, fn: Callable[[], object]) -> None:
    try:
        token.run_sync_soon(fn)
    except trio.RunFinishedError:
        pass


def settled(value: R, owner: int = 0) -> Future[R]:
    """A future that already holds `value`."""
    future: Future[R] = Future(owner)
    future._settle(value, None)
    return future
