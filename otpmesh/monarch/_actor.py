"""Monarch's actors over otpmesh's: ``Actor``, ``@endpoint``, ``context()``, ranks.

A Monarch actor is an otpmesh actor whose code runs on asyncio (Monarch's loop): its
``async def`` endpoints as asyncio tasks, its plain ``def`` endpoints on the same thread, so
both may ``await``/``.get()`` calls to other actors. An endpoint's exception goes back to its
caller (``ActorError``) and the actor keeps its state, as in Monarch: the endpoints are
otpmesh's ``let_it_crash=False`` ones. The actor still sits in otpmesh's supervision: its
crashes (a SIGKILL, a failed constructor, ``__cleanup__`` aside) restart it under a declared
tree, chaos and stacks reach it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from .._core import _actor as native
from .._core._exits import describe
from .._core._reasons import is_normal_exit
from ._hosts import this_proc
from ._meshes import ProcMesh, to_monarch, to_native
from ._values import Point

F = TypeVar("F", bound=Callable[..., Any])


class Actor(native.Actor, loop="asyncio"):
    """Base class of Monarch actors. Define ``__cleanup__(self, exc)`` for what Monarch runs
    when the actor stops (``exc`` is None on a normal stop), ``__supervise__`` for failures
    of the meshes it owns."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:  # its arguments are seen as Monarch objects too
            cls.__init__ = _monarch_init(init)  # type: ignore[method-assign]
        hook = cls.__dict__.get(native.SUPERVISE_HOOK)
        if hook is not None:
            setattr(cls, native.SUPERVISE_HOOK, _monarch_supervise(hook))

    async def on_stop(self, reason: object) -> None:
        cleanup = getattr(self, "__cleanup__", None)
        if cleanup is None:
            return
        exc = None if is_normal_exit(reason) else RuntimeError(describe(reason))
        result = cleanup(exc)
        if inspect.isawaitable(result):
            await result


def _monarch_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *to_monarch(args), **to_monarch(kwargs))

    return __init__


def _monarch_supervise(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Monarch's contract for ``__supervise__``: any truthy result means handled."""
    body = _wrap(hook)

    @functools.wraps(hook)
    async def __supervise__(self: Any, failure: Any) -> bool:
        return bool(await body(self, failure))

    return __supervise__


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as an async endpoint body: arguments seen as Monarch objects, results sent as
    otpmesh ones. A plain def runs on the actor's asyncio thread (it may block on .get())."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await fn(self, *to_monarch(args), **to_monarch(kwargs))
            return await to_native(result)

        return run_async

    @functools.wraps(fn)
    async def run_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        # On the actor's thread (its thread-locals are there), with the loop out of sight, as
        # Monarch runs a sync endpoint: it may block on .get(); trio carries the call meanwhile.
        loop = asyncio.get_running_loop()
        asyncio._set_running_loop(None)
        try:
            result = fn(self, *to_monarch(args), **to_monarch(kwargs))
        finally:
            asyncio._set_running_loop(loop)
        return await to_native(result)

    return run_sync


#: Monarch's error policy: an endpoint's exception goes back to its caller and the actor lives;
#: a broadcast's, which nobody would hear of, fails the actor.
_REPLY = native.endpoint(let_it_crash=native.UNANSWERED)
_CONCURRENT = native.endpoint(concurrent=True, let_it_crash=native.UNANSWERED)


@overload
def endpoint(fn: F, /) -> F: ...


@overload
def endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = False
) -> Callable[[F], F]: ...


def endpoint(
    fn: F | None = None,
    /,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = False,
) -> F | Callable[[F], F]:
    """Monarch's ``@endpoint``: the method is callable on the actor's meshes; its exception
    goes to the caller and the actor lives on."""
    if propagate is not None:
        raise NotImplementedError(
            "@endpoint(propagate=...) belongs to Monarch's tensor engine, which otpmesh does "
            "not have: return tensors from the endpoint instead"
        )

    def mark(f: F) -> F:
        # An explicit response port: the endpoint answers through it, whenever it likes; an
        # exception escaping it crashes the actor (Monarch's rule: nobody else can answer; said
        # here, as otpmesh's default would return it to a caller of an unsupervised actor).
        policy = (
            native.endpoint(reply_port=True, let_it_crash=True)
            if explicit_response_port
            else _REPLY
        )
        wrapped: F = policy(_wrap(f))  # type: ignore[assignment]
        return wrapped

    return mark(fn) if fn is not None else mark


def concurrent_endpoint(fn: F, /) -> F:
    """Monarch's ``@concurrent_endpoint``: an ``async def`` endpoint whose calls run at once,
    each in its own asyncio task, while the actor takes its next messages (otpmesh's
    ``@endpoint(concurrent=True)``; docs/guides/endpoints.md)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"@concurrent_endpoint on {fn.__qualname__}: it needs an 'async def' (a plain def "
            "cannot overlap with anything); use @endpoint for a plain def"
        )
    wrapped: F = _CONCURRENT(_wrap(fn))  # type: ignore[assignment]
    return wrapped


# ---------------------------------------------------------------- context and ranks


@dataclass(frozen=True)
class Instance:
    """The running actor: its name, id (path), rank and process."""

    name: str
    actor_id: str
    rank: Point

    @property
    def proc(self) -> ProcMesh:
        """A proc mesh to spawn siblings on (see ``this_proc``)."""
        return this_proc()


@dataclass(frozen=True)
class Context:
    """Where the running code is: ``actor_instance`` and ``message_rank``."""

    actor_instance: Instance
    message_rank: Point


_CLIENT = Instance("client", "client", Point({}, {}))


def context() -> Context:
    """The running actor's context; outside actors, the client's (rank 0 of nothing)."""
    try:
        ctx = native.context()
    except RuntimeError:
        return Context(_CLIENT, _CLIENT.rank)
    rank = Point(ctx.coords, ctx.shape)
    return Context(Instance(ctx.name, ctx.path, rank), rank)


def current_rank() -> Point:
    """The running actor's position in its mesh."""
    return context().actor_instance.rank


def current_size() -> Mapping[str, int]:
    """The running actor's mesh extent."""
    return current_rank().extent


def current_actor_name() -> str:
    """The running actor's own name (its path: each rank's differs)."""
    return context().actor_instance.actor_id
