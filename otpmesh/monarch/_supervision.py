"""Monarch's ``SupervisionError``: a call to an actor that died in it, or before it.

In Monarch an endpoint that raises a ``BaseException`` (not an ``Exception``) kills its actor,
and the call, and every later one, raises ``SupervisionError`` ("The actor ... and all its
descendants have failed"), a ``RuntimeError``. Here the actor's death is otpmesh's crash (its
supervisor, where it has one, restarts it); this module gives the caller Monarch's error, with
otpmesh's detail after Monarch's words.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .._core._errors import ActorDiedError, ActorError
from .._node._failure import MeshFailure


class SupervisionError(ActorDiedError, RuntimeError):
    """Raised by a Monarch call when its actor died in the call or before it (Monarch's name for
    otpmesh's ActorDiedError, whose ``actor`` and ``reason`` it carries)."""

    def __init__(
        self, actor: str, reason: str, *, delivered: bool = True, call: str | None = None
    ) -> None:
        super().__init__(actor, reason, delivered=delivered)
        words = f"The actor {actor} and all its descendants have failed: {reason}"
        self.args = (words if call is None else f"Endpoint call {call} failed, {words}",)

    def __str__(self) -> str:
        return str(self.args[0])


class ActorFailure(BaseException):
    """Raised (in the actor) in place of a BaseException its endpoint raised: the actor dies of
    it, and its caller hears a SupervisionError."""


#: Not failures: how asyncio and generators end code on purpose.
_PASSING = (asyncio.CancelledError, GeneratorExit)


def failure_of(exc: BaseException, *, explicit_port: bool = False) -> ActorFailure | None:
    """The ActorFailure an endpoint's `exc` becomes, or None for an Exception (it goes back to
    the caller) and for cancellation. An explicit-port endpoint's Exception is a failure too:
    its caller waits on the port, which only the endpoint answers (Monarch's rule)."""
    if isinstance(exc, (ActorFailure, *_PASSING)):
        return None
    if isinstance(exc, Exception) and not explicit_port:
        return None
    return ActorFailure(f"{type(exc).__qualname__}: {exc}")


def as_monarch(exc: BaseException, *, call: str | None = None) -> BaseException:
    """The error Monarch code sees for `exc`, raised by the call Monarch names `call`
    (``mesh.endpoint()``) where there is one."""
    if isinstance(exc, SupervisionError):
        return exc
    if isinstance(exc, ActorDiedError):
        error = SupervisionError(exc.actor, str(exc), delivered=exc.delivered, call=call)
        return _chained(error, exc)
    if isinstance(exc, ActorError) and exc.type_name == ActorFailure.__qualname__:
        return _chained(SupervisionError(exc.actor, f"it raised {exc.message}", call=call), exc)
    return exc


def _chained(new: BaseException, cause: BaseException) -> BaseException:
    new.__cause__ = cause
    return new


@dataclass(frozen=True, slots=True)
class MonarchFailure(MeshFailure):
    """A MeshFailure as Monarch's hooks see it (``__supervise__``, ``unhandled_fault_hook``):
    it prints as Monarch's does, ``MeshFailure(mesh_name=..., crashed_ranks=[...], event=...)``;
    ``report()`` gives otpmesh's words."""

    @classmethod
    def of(cls, failure: MeshFailure) -> MeshFailure:
        if not isinstance(failure, MeshFailure) or isinstance(failure, MonarchFailure):
            return failure
        return cls(failure.mesh, failure.path, failure.rank, failure.reason)

    def __str__(self) -> str:
        event = MeshFailure.__str__(self)
        return f"MeshFailure(mesh_name={self.mesh}, crashed_ranks=[{self.rank}], event={event})"

    def report(self) -> str:
        return MeshFailure.__str__(self)
