"""Where a Monarch actor with plain ``def`` endpoints runs its code: a thread of its own.

Monarch actors of one process share its asyncio loop (``_node/_aioloop.py``). A plain ``def``
endpoint may block on ``.get()`` (Monarch's sync style); on the loop's thread it would hold the
loop, and a call to another actor of the same process, served by that loop, would never be
answered. So, as in Monarch (an actor is all-sync or all-async, never both), an all-sync actor's
constructor, endpoints and ``__cleanup__`` run one at a time on a thread of the actor's own,
while the loop goes on serving its neighbours. Its thread-locals live from constructor to stop.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._core._actor import Actor
from .._node._aioloop import AsyncioThread, bridge, lend

T = TypeVar("T")

#: The name of an actor's own thread (its stack is read as any thread's).
THREAD_NAME = "otpmesh-monarch-sync"

_Job = tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...], Callable[[bool, Any], None]]


def _settle(done: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if done.done():  # its caller gave up (cancelled): the job ran to its end all the same
        return
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)


#: Set on each Monarch endpoint body (``_actor._wrap``): True for a plain def.
SYNC_ATTR = "__otpmesh_monarch_sync__"
_THREAD_ATTR = "_otpmesh_monarch_thread"


def endpoint_styles(cls: type) -> tuple[list[str], list[str]]:
    """The names of `cls`'s plain-def endpoints and of its async ones."""
    plain: list[str] = []
    coroutines: list[str] = []
    for name in sorted(cls.endpoints()) if issubclass(cls, Actor) else ():
        style = getattr(getattr(cls, name, None), SYNC_ATTR, None)
        if style is not None:
            (plain if style else coroutines).append(name)
    return plain, coroutines


def is_sync(cls: type) -> bool:
    """Whether actors of `cls` run their code on threads of their own (it has plain-def
    endpoints)."""
    return bool(endpoint_styles(cls)[0])


def check_styles(cls: type) -> None:
    """Monarch's rule, checked at spawn: an actor's endpoints are all plain or all async."""
    plain, coroutines = endpoint_styles(cls)
    if plain and coroutines:
        raise ValueError(
            f"{cls.__qualname__} mixes both async and sync endpoints (Monarch's rule: a plain "
            "def may block on .get(), so it runs on a thread of its own, and async ones on the "
            f"process's loop): make them all 'def' or all 'async def'. sync: {plain} "
            f"async: {coroutines}"
        )


def own_thread(instance: object) -> SyncThread:
    """The thread `instance`'s plain code runs on, started on first use."""
    thread: SyncThread | None = instance.__dict__.get(_THREAD_ATTR)
    if thread is None:
        thread = SyncThread(bridge(), type(instance).__qualname__)
        instance.__dict__[_THREAD_ATTR] = thread
    return thread


def close_thread(instance: object) -> None:
    """End `instance`'s own thread, if it has one (the actor stopped)."""
    thread: SyncThread | None = instance.__dict__.pop(_THREAD_ATTR, None)
    if thread is not None:
        thread.close()


class SyncThread:
    """One daemon thread running an actor's plain code, one job at a time, in the caller's
    context; its calls to other actors go through `aio`'s trio run, as the loop's code does."""

    __slots__ = ("_jobs", "_thread")

    def __init__(self, aio: AsyncioThread | None, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # A daemon: an endpoint blocked for ever must not hold its process at exit.
        self._thread = threading.Thread(
            target=self._serve, args=(aio,), name=f"{THREAD_NAME}:{name}", daemon=True
        )
        self._thread.start()

    def _serve(self, aio: AsyncioThread | None) -> None:
        if aio is not None:  # else: an actor made by hand, outside otpmesh (a unit test)
            lend(aio)
        while (job := self._jobs.get()) is not None:
            context, fn, args, settle = job
            try:
                value = context.run(fn, *args)
            except BaseException as exc:  # the endpoint's caller hears of it, whatever it is
                settle(False, exc)
            else:
                settle(True, value)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this thread, in the caller's context, awaited on the running
        asyncio loop (which serves other actors meanwhile)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:  # on this thread: woken on the loop's
            loop.call_soon_threadsafe(_settle, done, ok, value)

        self._jobs.put((contextvars.copy_context(), fn, args, settle))
        return await done

    def close(self) -> None:
        """End the thread once the jobs before this are done."""
        self._jobs.put(None)

    @property
    def ident(self) -> int | None:
        return self._thread.ident
