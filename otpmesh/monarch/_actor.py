"""Monarch's actors over otpmesh's: ``Actor``, ``@endpoint``, ``context()``, ranks.

A Monarch actor is an otpmesh actor whose code runs on asyncio (Monarch's loop): its
``async def`` endpoints as asyncio tasks on its process's loop; an actor with plain ``def``
endpoints runs them, its constructor and ``__cleanup__`` on a thread of its own
(``_syncthread.py``), so both kinds may ``await``/``.get()`` calls to other actors, those of
their own process too. As in Monarch, one actor's endpoints are all plain or all async.
An endpoint's exception goes back to its caller (``ActorError``) and the actor keeps its
state, as in Monarch: the endpoints are otpmesh's ``let_it_crash=False`` ones. The actor
still sits in otpmesh's supervision: its crashes (a SIGKILL, a failed constructor,
``__cleanup__`` aside) restart it under a declared tree, chaos and stacks reach it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, overload

from .._core import _actor as native
from .._core._exits import describe
from .._core._reasons import is_normal_exit
from .._node._aioloop import bridge
from ._hosts import this_proc
from ._meshes import ProcMesh, to_monarch, to_native
from ._supervision import ActorFailure, MonarchFailure, failure_of
from ._syncthread import SYNC_ATTR, close_thread, is_sync, own_thread
from ._values import Point

F = TypeVar("F", bound=Callable[..., Any])


class Actor(native.Actor, loop="asyncio"):
    """Base class of Monarch actors. Define ``__cleanup__(self, exc)`` for what Monarch runs
    when the actor stops (``exc`` is None on a normal stop), ``__supervise__`` for failures
    of the meshes it owns."""

    @property
    def logger(self) -> logging.Logger:
        """Monarch's ``self.logger``: a logger named after the actor's class, at DEBUG (an
        actor may set its own)."""
        logger: logging.Logger | None = self.__dict__.get(_LOGGER)
        if logger is None:
            logger = self.__dict__[_LOGGER] = logging.getLogger(type(self).__name__)
            logger.setLevel(logging.DEBUG)
        return logger

    @logger.setter
    def logger(self, logger: logging.Logger) -> None:
        self.__dict__[_LOGGER] = logger

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:  # its arguments are seen as Monarch objects too
            cls.__init__ = _monarch_init(init)  # type: ignore[method-assign]
        hook = cls.__dict__.get(native.SUPERVISE_HOOK)
        if hook is not None:
            setattr(cls, native.SUPERVISE_HOOK, _monarch_supervise(hook))

    async def on_start(self) -> None:
        """An actor with plain-def endpoints is constructed here, on its own thread."""
        init = self.__dict__.pop(_PENDING_INIT, None)
        if init is not None:
            await own_thread(self).run(init)

    async def on_stop(self, reason: object) -> None:
        try:
            cleanup = getattr(self, "__cleanup__", None)
            if cleanup is None:
                return
            exc = None if is_normal_exit(reason) else RuntimeError(describe(reason))
            if is_sync(type(self)) and not inspect.iscoroutinefunction(cleanup):
                result = await own_thread(self).run(cleanup, exc)
            else:
                result = cleanup(exc)
            if inspect.isawaitable(result):
                await result
        finally:
            close_thread(self)


#: Where an actor keeps its logger (``Actor.logger``).
_LOGGER = "_otpmesh_monarch_logger"
#: Where a sync actor's constructor call waits for on_start.
_PENDING_INIT = "_otpmesh_monarch_init"


def _on_loop() -> bool:
    """Whether the caller runs on an asyncio actor thread's loop (not on a sync actor's own)."""
    if bridge() is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _monarch_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        call = functools.partial(init, self, *to_monarch(args), **to_monarch(kwargs))
        if is_sync(type(self)) and _on_loop():
            # Spawned, on the process's loop: it runs on the actor's own thread in on_start
            # (it may block on .get(), even for ever, while the loop serves its neighbours).
            self.__dict__.setdefault(_PENDING_INIT, call)
        else:
            call()

    return __init__


def _monarch_supervise(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Monarch's contract for ``__supervise__``: any truthy result means handled. It runs at
    once, even while one of the actor's endpoints awaits (it may await what the hook sets), as
    Monarch's supervision events do."""
    body = _wrap(hook)

    @functools.wraps(hook)
    async def __supervise__(self: Any, failure: Any) -> bool:
        return bool(await body(self, MonarchFailure.of(failure)))

    served: Callable[..., Any] = _SUPERVISE(__supervise__)
    return served


def _wrap(fn: Callable[..., Any], *, explicit_port: bool = False) -> Callable[..., Any]:
    """`fn` as an async endpoint body: arguments seen as Monarch objects, results sent as
    otpmesh ones. A plain def runs on its actor's own thread (it may block on .get())."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = await fn(self, *to_monarch(args), **to_monarch(kwargs))
            except BaseException as exc:
                _fail(self, exc, explicit_port)
                raise
            return await to_native(result)

        setattr(run_async, SYNC_ATTR, False)
        return run_async

    @functools.wraps(fn)
    async def run_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = functools.partial(fn, self, *to_monarch(args), **to_monarch(kwargs))
        try:
            result = await own_thread(self).run(call)
        except BaseException as exc:
            _fail(self, exc, explicit_port)
            raise
        return await to_native(result)

    setattr(run_sync, SYNC_ATTR, True)
    return run_sync


class _Aborted(ActorFailure):
    """Raised by ``abort()``: the wrapper names the actor that aborted."""


def _fail(actor: Any, exc: BaseException, explicit_port: bool) -> None:
    """Monarch's rule: a BaseException (not an Exception) escaping an endpoint kills the actor
    and its caller hears a SupervisionError (``_supervision.py``)."""
    if isinstance(exc, _Aborted):  # Monarch's failure names the actor, class and all
        cls = type(actor)
        who = f"<{cls.__module__}.{cls.__qualname__} {native.context().path}>"
        raise ActorFailure(f"actor {who} aborted: {exc}") from None
    failure = failure_of(exc, explicit_port=explicit_port)
    if failure is not None:
        raise failure from exc


#: Monarch's error policy: an endpoint's exception goes back to its caller and the actor lives;
#: a broadcast's, which nobody would hear of, fails the actor.
_REPLY = native.endpoint(let_it_crash=native.UNANSWERED)
_CONCURRENT = native.endpoint(concurrent=True, let_it_crash=native.UNANSWERED)
_CONCURRENT_PORT = native.endpoint(concurrent=True, reply_port=True, let_it_crash=True)
#: The owner hook: served at once; its exception goes to the controller, which fails the owner.
_SUPERVISE = native.endpoint(concurrent=True, let_it_crash=False)


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
        # exception escaping it kills the actor and its caller hears SupervisionError
        # (Monarch's rule: nobody else can answer).
        policy = (
            native.endpoint(reply_port=True, let_it_crash=True)
            if explicit_response_port
            else _REPLY
        )
        wrapped: F = policy(_wrap(f, explicit_port=explicit_response_port))  # type: ignore[assignment]
        return wrapped

    return mark(fn) if fn is not None else mark


@overload
def concurrent_endpoint(fn: F, /) -> F: ...


@overload
def concurrent_endpoint(*, explicit_response_port: bool = False) -> Callable[[F], F]: ...


def concurrent_endpoint(
    fn: F | None = None, /, *, explicit_response_port: bool = False
) -> F | Callable[[F], F]:
    """Monarch's ``@concurrent_endpoint``: an ``async def`` endpoint whose calls run at once,
    each in its own asyncio task, while the actor takes its next messages (otpmesh's
    ``@endpoint(concurrent=True)``; docs/guides/endpoints.md). With
    ``explicit_response_port=True`` it answers through the port it is given first."""

    def mark(f: F) -> F:
        name = getattr(f, "__qualname__", repr(f))
        if hasattr(f, SYNC_ATTR):
            raise ValueError(
                f"@concurrent_endpoint on {name} does not wrap @endpoint: use one of the two"
            )
        if not inspect.iscoroutinefunction(f):
            raise ValueError(
                f"@concurrent_endpoint can only wrap async endpoints: {name} is a plain def "
                "(it cannot overlap with anything); write 'async def', or use @endpoint"
            )
        policy = _CONCURRENT_PORT if explicit_response_port else _CONCURRENT
        wrapped: F = policy(_wrap(f, explicit_port=explicit_response_port))  # type: ignore[assignment]
        return wrapped

    return mark(fn) if fn is not None else mark


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

    @property
    def proc_mesh(self) -> ProcMesh:
        """Monarch's actor's proc mesh; here, as ``proc``, a one-process mesh to spawn on
        (``this_proc``): an actor does not hold its mesh's processes here."""
        return this_proc()

    def abort(self, reason: str | None = None) -> NoReturn:
        """End the running actor as failed, now: its caller hears ``SupervisionError``, and its
        owner's ``__supervise__`` (or ``unhandled_fault_hook``) a failure that gives `reason`
        ("no reason provided" without one). Unlike Monarch's, it does not return: the endpoint
        ends here."""
        if self is _CLIENT:
            raise RuntimeError(
                "abort() ends the running actor: call it in an actor's endpoint "
                "(outside actors, raise an exception or call sys.exit)"
            )
        raise _Aborted(reason if reason is not None else "no reason provided")


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
