"""Actors, endpoints and the per-actor context."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

from ._reasons import NORMAL
from ._signature import Params

F = TypeVar("F", bound=Callable[..., Any])

_ENDPOINT_ATTR = "__otpmesh_endpoint__"


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """What `@endpoint` recorded about a method: its parameters too (None: Python cannot
    tell them), against which every call is checked, in the caller and in the actor."""

    name: str
    is_async: bool
    let_it_crash: bool
    progress_deadline: float | None = None
    params: Params | None = None


class Actor:
    """Base class of actors: subclass it and mark methods with ``@otpmesh.endpoint``.

    The constructor runs in the actor's own process. An actor handles one message at a time.
    An exception escaping an endpoint crashes the actor ("let it crash") unless the endpoint
    was declared with ``@endpoint(let_it_crash=False)``. Any other BaseException its code
    raises ends this actor only, never its process: ``sys.exit()`` or ``sys.exit(0)`` stops it
    normally, anything else is a crash (docs/supervision.md).
    """

    async def on_start(self) -> None:
        """Called in the actor's process after the constructor, before any message. Raise to fail
        the start; raise ``otpmesh.Ignore`` to return OTP's ``ignore``."""

    async def on_stop(self, reason: object) -> None:
        """Called once when the actor stops (its supervisor asked, ``self.stop``, or a crash),
        with the exit reason. Its child spec's ``shutdown`` bounds how long it may take."""

    def stop(self, reason: object = NORMAL) -> None:
        """End this actor after the current message, with `reason` ('normal', 'shutdown',
        ('shutdown', detail), or any other value, which its supervisor treats as a failure)."""
        try:
            request = _current_stop.get()
        except LookupError:
            raise RuntimeError(
                "Actor.stop() is only available inside the actor's own code"
            ) from None
        request(reason)

    @classmethod
    def endpoints(cls) -> dict[str, EndpointInfo]:
        """The endpoints of this class, by name."""
        found: dict[str, EndpointInfo] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                info = getattr(value, _ENDPOINT_ATTR, None)
                if isinstance(info, EndpointInfo):
                    found[name] = info
                elif name in found and callable(value):  # overridden without @endpoint:
                    found[name] = replace(found[name], params=Params.of(value))  # called so
        return found


@overload
def endpoint(fn: F, /) -> F: ...


@overload
def endpoint(
    *, let_it_crash: bool = True, progress_deadline: float | None = None
) -> Callable[[F], F]: ...


def endpoint(
    fn: F | None = None,
    /,
    *,
    let_it_crash: bool = True,
    progress_deadline: float | None = None,
) -> F | Callable[[F], F]:
    """Mark an actor method as an endpoint callable from anywhere.

    ``async def`` endpoints run in the actor's task; plain ``def`` endpoints run inline.
    Every call is checked against the method's signature: arguments that do not bind are a
    TypeError in the caller, naming the actor and the endpoint, and the actor never sees them.
    With ``let_it_crash=False`` an exception is returned to the caller and the actor lives on.
    ``progress_deadline`` (seconds) overrides the child spec's for this endpoint: past it without
    ``otpmesh.progress()``, the actor exits as hung.
    """
    if progress_deadline is not None and (
        isinstance(progress_deadline, bool)
        or not isinstance(progress_deadline, int | float)
        or not 0 < progress_deadline < float("inf")
    ):
        raise ValueError(
            f"@endpoint(progress_deadline={progress_deadline!r}): "
            "expected None or a positive number of seconds"
        )

    def mark(f: F) -> F:
        if not callable(f):
            raise TypeError(f"@endpoint decorates a method, not {f!r}")
        info = EndpointInfo(
            f.__name__,
            inspect.iscoroutinefunction(f),
            let_it_crash,
            None if progress_deadline is None else float(progress_deadline),
            Params.of(f),
        )
        setattr(f, _ENDPOINT_ATTR, info)
        return f

    if fn is not None:
        return mark(fn)
    return mark


@dataclass(frozen=True, slots=True)
class ActorContext:
    """Where the running actor sits: its mesh name, path, rank, coordinates and mesh shape."""

    name: str
    path: str
    rank: int
    coords: dict[str, int] = field(default_factory=dict)
    shape: dict[str, int] = field(default_factory=dict)
    pid: int = 0


_current: contextvars.ContextVar[ActorContext] = contextvars.ContextVar("otpmesh_actor_context")
_current_stop: contextvars.ContextVar[Callable[[object], None]] = contextvars.ContextVar(
    "otpmesh_actor_stop"
)


def context() -> ActorContext:
    """The context of the actor whose code is running (constructor or endpoint)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "otpmesh.context() is only available inside an actor's constructor or endpoints"
        ) from None


_current_progress: contextvars.ContextVar[Callable[[], None]] = contextvars.ContextVar(
    "otpmesh_actor_progress"
)


def set_context(
    ctx: ActorContext,
    stop: Callable[[object], None] | None = None,
    progress: Callable[[], None] | None = None,
) -> None:
    """Make `ctx` (and the actor's stop request and progress mark) visible to code in the
    current context."""
    _current.set(ctx)
    if stop is not None:
        _current_stop.set(stop)
    if progress is not None:
        _current_progress.set(progress)


def progress() -> None:
    """Say that the running endpoint is still moving: its progress deadline (the child spec's
    ``progress_deadline``, or ``@endpoint(progress_deadline=...)``) starts again from now.

    Call it from the endpoint itself (its task or, for a plain ``def`` endpoint, its thread);
    outside an actor it raises RuntimeError. It costs a clock read.
    """
    try:
        mark = _current_progress.get()
    except LookupError:
        raise RuntimeError(
            "otpmesh.progress() is only available inside an actor's endpoints"
        ) from None
    mark()


def class_path(cls: type) -> str:
    """The import path a class travels by: 'module:QualName'."""
    if "<locals>" in cls.__qualname__:
        raise TypeError(
            f"actor class {cls.__qualname__} is defined inside a function; define it at module "
            "level so worker processes can import it"
        )
    return f"{cls.__module__}:{cls.__qualname__}"
