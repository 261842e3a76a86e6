"""Actors, endpoints and the per-actor context."""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeVar, overload

from ._reasons import NORMAL
from ._signature import Params

F = TypeVar("F", bound=Callable[..., Any])

_ENDPOINT_ATTR = "__otpmesh_endpoint__"
_LOOP_ATTR = "__otpmesh_loop__"
_POLICY_ATTR = "__otpmesh_let_it_crash__"

#: How many calls a ``@endpoint(concurrent=True)`` endpoint serves at once, at most: past it,
#: the actor's mailbox waits (backpressure, in mailbox order) until one of them ends.
CONCURRENT_LIMIT = 256

#: The event loops an actor's async code may run on (``class A(Actor, loop="asyncio")``).
TRIO = "trio"
ASYNCIO = "asyncio"
LOOPS = (TRIO, ASYNCIO)


#: The error policy that crashes the actor only for an exception nobody waits for (a cast's):
#: a call's goes back to its caller (``@endpoint(let_it_crash=UNANSWERED)``; Monarch's rule).
UNANSWERED: Final = "unanswered"
Policy = bool | Literal["unanswered"]


def _is_policy(value: object) -> bool:
    return isinstance(value, bool) or value == UNANSWERED


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """What `@endpoint` recorded about a method: its parameters too (None: Python cannot
    tell them), against which every call is checked, in the caller and in the actor."""

    name: str
    is_async: bool
    #: The error policy: True crashes the actor (the default), False replies the exception to
    #: the caller, UNANSWERED replies it to a caller and crashes on a cast; None (as
    #: decorated) takes the class's (``class A(Actor, let_it_crash=...)``).
    let_it_crash: Policy | None
    progress_deadline: float | None = None
    params: Params | None = None
    #: How many calls of it may be in flight at once (0: a serial endpoint).
    concurrent: int = 0
    #: A plain def run in a worker thread, so it may block (``@endpoint(blocking=True)``).
    blocking: bool = False
    #: The endpoint replies through a Port, its first argument, not with its return value.
    reply_port: bool = False


class Actor:
    """Base class of actors: subclass it and mark methods with ``@otpmesh.endpoint``.

    The constructor runs in the actor's own process. An actor handles one message at a time.
    An exception escaping an endpoint crashes the actor ("let it crash") unless the endpoint
    was declared with ``@endpoint(let_it_crash=False)``. Any other BaseException its code
    raises ends this actor only, never its process: ``sys.exit()`` or ``sys.exit(0)`` stops it
    normally, anything else is a crash (docs/supervision.md).

    Its async code (``on_start``, ``on_stop``, ``async def`` endpoints) runs on trio, the
    runtime's own loop, unless the class asks for asyncio: ``class Engine(Actor,
    loop="asyncio")`` runs it as asyncio tasks, so it can await asyncio libraries.
    """

    def __init_subclass__(
        cls, *, loop: str | None = None, let_it_crash: Policy | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if let_it_crash is not None:
            if not _is_policy(let_it_crash):
                raise TypeError(
                    f"class {cls.__qualname__}(Actor, let_it_crash={let_it_crash!r}): expected "
                    "True (an endpoint's exception crashes the actor), False (it goes back "
                    f"to the caller) or {UNANSWERED!r} (back to a caller; a cast's crashes it)"
                )
            setattr(cls, _POLICY_ATTR, let_it_crash)
        if loop is None:
            return
        if loop not in LOOPS:
            raise ValueError(
                f"class {cls.__qualname__}(Actor, loop={loop!r}): loop must be one of "
                f"{', '.join(map(repr, LOOPS))}"
            )
        setattr(cls, _LOOP_ATTR, loop)

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
        """The endpoints of this class, by name, each with its error policy settled: its own,
        else its class's; None where neither said one (the default, _node/_policy.py)."""
        found: dict[str, EndpointInfo] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                info = getattr(value, _ENDPOINT_ATTR, None)
                if isinstance(info, EndpointInfo):
                    found[name] = info
                elif name in found and callable(value):  # overridden without @endpoint:
                    found[name] = replace(found[name], params=Params.of(value))  # called so
        default: Policy | None = getattr(cls, _POLICY_ATTR, None)
        for name, info in found.items():
            if info.let_it_crash is None and default is not None:
                found[name] = replace(info, let_it_crash=default)
        return found


def runs_on(cls: type[Actor]) -> str:
    """Which event loop runs the async code of actor class `cls`: 'trio' or 'asyncio'."""
    loop: str = getattr(cls, _LOOP_ATTR, TRIO)
    return loop


#: The owner hook (Monarch's name): what an actor that spawned a mesh is told when one of its
#: actors fails; served like an endpoint, called by the controller
#: (docs/guides/owned-meshes.md).
SUPERVISE_HOOK = "__supervise__"


def served(cls: type[Actor]) -> dict[str, EndpointInfo]:
    """What an actor of `cls` serves: its endpoints, and its owner hook if it has one."""
    found = cls.endpoints()
    hook = getattr(cls, SUPERVISE_HOOK, None)
    if callable(hook):
        declared = getattr(hook, _ENDPOINT_ATTR, None)  # served as its own @endpoint says
        found[SUPERVISE_HOOK] = (
            replace(declared, name=SUPERVISE_HOOK)
            if isinstance(declared, EndpointInfo)
            else EndpointInfo(SUPERVISE_HOOK, inspect.iscoroutinefunction(hook), True)
        )
    return found


@overload
def endpoint(fn: F, /) -> F: ...


@overload
def endpoint(
    *,
    let_it_crash: Policy | None = None,
    progress_deadline: float | None = None,
    concurrent: bool | int = False,
    blocking: bool = False,
    reply_port: bool = False,
) -> Callable[[F], F]: ...


def endpoint(
    fn: F | None = None,
    /,
    *,
    let_it_crash: Policy | None = None,
    progress_deadline: float | None = None,
    concurrent: bool | int = False,
    blocking: bool = False,
    reply_port: bool = False,
) -> F | Callable[[F], F]:
    """Mark an actor method as an endpoint callable from anywhere.

    ``async def`` endpoints run in the actor's task (an asyncio task for an actor declared with
    ``loop="asyncio"``), one call at a time; plain ``def`` endpoints run inline, on the
    event loop's thread, so they must not block.
    Every call is checked against the method's signature: arguments that do not bind are a
    TypeError in the caller, naming the actor and the endpoint, and the actor never sees them.

    - ``let_it_crash``: the error policy. True (the default, unless the class says
      ``class A(Actor, let_it_crash=False)``): an exception crashes the actor and its
      supervisor restarts it. False: the exception goes back to the caller (a broadcast's is
      logged) and the actor lives on with its state. ``UNANSWERED`` (``"unanswered"``,
      Monarch's rule): back to a caller that waits for it; a broadcast's, which nobody would
      hear of, crashes the actor.
    - ``progress_deadline`` (seconds) overrides the child spec's for this endpoint: past it
      without ``otpmesh.progress()``, the actor exits as hung.
    - ``concurrent=True`` (an ``async def`` only): each call runs in its own task, started in
      mailbox order, while the actor goes on to its next message; re-entrant calls into it are
      not refused as deadlocks. At most ``CONCURRENT_LIMIT`` calls in flight, or N with
      ``concurrent=N``.
    - ``blocking=True`` (a plain ``def`` only): each call runs in a worker thread, one at a
      time like any serial endpoint, so it may block (``time.sleep``, I/O, a call to another
      actor through ``trio.from_thread.run``) while the actor's process serves on.
    - ``reply_port=True``: the endpoint replies through a Port, its first parameter after
      ``self`` (callers do not pass it), instead of with its return value: the caller's call
      returns the first value sent on it, even after the endpoint returned
      (docs/guides/ports.md).

    docs/guides/endpoints.md says what each means for ordering, deadlocks and failures.
    """
    limit = _concurrency(concurrent)
    if let_it_crash is not None and not _is_policy(let_it_crash):
        raise TypeError(
            f"@endpoint(let_it_crash={let_it_crash!r}): expected True, False or {UNANSWERED!r}"
        )
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
        is_async = inspect.iscoroutinefunction(f)
        name = getattr(f, "__name__", repr(f))
        if limit and not is_async:
            raise TypeError(
                f"@endpoint(concurrent=...) on {name}: a plain def runs to its end on the "
                f"event loop, so its calls cannot overlap; write 'async def {name}(...)', or, "
                "for a plain def that blocks, use @endpoint(blocking=True)"
            )
        if blocking and is_async:
            raise TypeError(
                f"@endpoint(blocking=True) on async def {name}: an async endpoint waits by "
                "awaiting and never needs a thread; drop blocking=True (or make it a plain def)"
            )
        params = Params.of(f)
        if reply_port:
            params = _without_port(f, params)
        info = EndpointInfo(
            f.__name__,
            is_async,
            let_it_crash,
            None if progress_deadline is None else float(progress_deadline),
            params,
            reply_port=reply_port,
            concurrent=limit,
            blocking=bool(blocking),
        )
        setattr(f, _ENDPOINT_ATTR, info)
        return f

    if fn is not None:
        return mark(fn)
    return mark


def _concurrency(concurrent: bool | int) -> int:
    """The cap on calls in flight that ``@endpoint(concurrent=...)`` asks for (0: serial)."""
    if concurrent is True:
        return CONCURRENT_LIMIT
    if concurrent is False:
        return 0
    if not isinstance(concurrent, int) or concurrent < 1:
        raise ValueError(
            f"@endpoint(concurrent={concurrent!r}): expected True (at most {CONCURRENT_LIMIT} "
            "calls in flight), False, or a positive int (at most that many)"
        )
    return concurrent


def _without_port(f: Callable[..., Any], params: Params | None) -> Params | None:
    """The parameters callers pass to a ``reply_port`` endpoint: all but its port."""
    if params is None:
        return None
    if not params.kinds or params.kinds[0] not in "pa":
        raise TypeError(
            f"@endpoint(reply_port=True) on {f.__qualname__}{params}: the endpoint takes its "
            "reply port as its first parameter after self, e.g. 'def ask(self, port, x)'"
        )
    return Params(params.names[1:], params.kinds[1:])


@dataclass(frozen=True, slots=True)
class ActorContext:
    """Where the running actor sits: its mesh name, path, rank, coordinates and mesh shape."""

    name: str
    path: str
    rank: int
    coords: dict[str, int] = field(default_factory=dict)
    shape: dict[str, int] = field(default_factory=dict)
    pid: int = 0

    async def start(self, spec: Any) -> Any:
        """Start the supervision tree `spec` (a Supervisor or Mesh) owned by this actor, with
        OTP's rules inside it; return its ``Subtree`` (refs by path, under this actor's path).
        When it gives up, this actor crashes with its SupervisorError; when this actor exits,
        it is stopped. docs/guides/owned-meshes.md."""
        if _start_hook is None:
            raise RuntimeError("otpmesh's controller layer is not loaded (import otpmesh)")
        return await _start_hook(self.path, spec)


#: How an actor starts a tree it owns: set by the controller layer (otpmesh._controller._owned),
#: which this pure layer cannot import.
_start_hook: Callable[[str, Any], Awaitable[Any]] | None = None


def set_start_hook(hook: Callable[[str, Any], Awaitable[Any]]) -> None:
    global _start_hook
    _start_hook = hook


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


def current_path() -> str | None:
    """The path of the actor whose code is running, or None outside actors."""
    ctx = _current.get(None)
    return None if ctx is None else ctx.path


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

    Call it from the endpoint itself (its task or, for a plain ``def`` endpoint, its thread,
    a blocking one's worker thread included); it marks the call it is called from, one of
    several in flight for a concurrent endpoint. Outside an actor it raises RuntimeError. It
    costs a clock read.
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
    module = cls.__module__
    # A class of the controller's main file, met in a worker (which imported that file under
    # another name): it travels as the controller's own, so any process of the app finds it.
    if module == MAIN_ALIAS:
        module = "__main__"
    return f"{module}:{cls.__qualname__}"


#: The name worker processes import the controller's main file under.
MAIN_ALIAS = "__otpmesh_main__"
