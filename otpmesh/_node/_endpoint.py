"""Endpoints: the ways to call actors (call, call_one, choose, broadcast, stream, reduce).

Each way returns a Future (``_future.py``) whose coroutine is made only when it is awaited or
waited for, with the endpoint's timeout or the one ``get(timeout)`` gives. A call that never
reached a supervised actor (it was restarting) is sent again to its next incarnation; one that
reached it and lost it reports the failure: every way follows that rule, reductions included.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Generic, TypeVar

from .._core._errors import MeshError
from .._core._shape import Shape
from .._core._signature import Params, bind_error
from .._core._valuemesh import ValueMesh
from ._asarrive import RepliesAsTheyCome
from ._attempts import Attempts, calling_node, resendable, unwrap
from ._calls import CallGroup
from ._future import Future
from ._lost import NO_RETRY, LostRetry
from ._node import Node
from ._slot import Slot

T = TypeVar("T")
R = TypeVar("R")


def check_timeout(seconds: float | None) -> float | None:
    if seconds is not None and (not isinstance(seconds, int | float) or not seconds > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {seconds!r}")
    return seconds


class Target:
    """What an endpoint calls: the slots and shape of a mesh or ref, and how to name it."""

    __slots__ = ("name", "shape", "single", "slots", "who")

    def __init__(self, name: str, shape: Shape, slots: list[Slot], *, single: bool) -> None:
        self.name = name  # the mesh's name
        self.shape = shape
        self.slots = slots
        self.single = single  # an actor ref: calling it returns the one value
        self.who = slots[0].actor_id if single else name


class Endpoint(Attempts, RepliesAsTheyCome):
    """One endpoint of a mesh or ref; the ways to call it. Each checks its arguments against the
    endpoint's signature first: TypeError here when they do not bind, and nothing is sent."""

    __slots__ = ("_name", "_owner", "_params", "_retry", "_timeout")
    _owner: Target

    def __init__(
        self,
        owner: Target,
        name: str,
        params: Params | None,
        timeout: float | None,
        retry: LostRetry = NO_RETRY,
    ) -> None:
        self._owner = owner
        self._name = name
        self._timeout = timeout
        self._params = params
        self._retry = retry

    def __repr__(self) -> str:
        return f"{self._owner.who}.{self._name}"

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        params = self._params
        if params is not None:
            problem = params.problem(len(args), kwargs)
            if problem is not None:
                raise TypeError(bind_error(self._owner.who, self._name, params, problem))

    def with_timeout(self, seconds: float | None) -> Endpoint:
        """This endpoint with a timeout: on expiry a call raises CallTimeoutError naming actors."""
        return Endpoint(self._owner, self._name, self._params, check_timeout(seconds), self._retry)

    def with_retry(self, *, lost: int) -> Endpoint:
        """This endpoint, whose calls send a member's call again to its actor's next incarnation
        when the call reached the actor and was lost with it (the actor died before it replied),
        up to `lost` times per member; the other members' results are kept, so nothing that
        answered runs twice. Only for an endpoint that is safe to run again: idempotent, or its
        effect lost with the actor. Unsupervised or permanently gone actors fail as before."""
        return Endpoint(self._owner, self._name, self._params, self._timeout, LostRetry(lost))

    def __call__(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """On a mesh: ``call`` (a ValueMesh). On an actor ref: ``call_one`` (the value)."""
        if self._owner.single:
            return self.call_one(*args, **kwargs)
        return self.call(*args, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[Any]]:
        """Call every actor; their values by coordinates. Raises the first error by rank."""
        self._bind(args, kwargs)
        return Future(Endpoint._begin, self, Endpoint._call, args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the one actor of a single-actor mesh or ref; its value."""
        self._bind(args, kwargs)
        if len(self._owner.slots) != 1:
            raise MeshError(
                f"call_one on {self._owner.name} of {len(self._owner.slots)} actors: index one "
                f"actor (mesh[i].{self._name}.call_one(...)) or use .call(...) for all of them"
            )
        return Future(Endpoint._begin, self, Endpoint._call_one, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call exactly one actor, the one with the fewest calls in flight from this process."""
        self._bind(args, kwargs)
        return Future(Endpoint._begin, self, Endpoint._choose, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Future[None]:
        """Send to every actor without waiting for results (FIFO with later calls from here)."""
        self._bind(args, kwargs)
        return Future(Endpoint._begin, self, Endpoint._broadcast, args, kwargs)

    def reduce(self, combine: Callable[[R, Any], R], initial: R) -> Reduction[R]:
        """A reduction of this endpoint's replies on the caller's side, as they arrive:
        ``await mesh.ep.reduce(operator.add, 0)(x)`` is ``combine(...combine(initial, v1)...,
        vn)`` over every actor's value, in arrival order (so `combine` should not care about
        order). Calls are sent and retried as ``call``'s; the first error raises."""
        if not callable(combine):
            raise TypeError(
                f"reduce(combine, initial) needs a function combine(accumulated, value), not "
                f"{combine!r}; e.g. mesh.{self._name}.reduce(operator.add, 0)(...)"
            )
        return Reduction(self, combine, initial)

    def _begin(
        self,
        method: Callable[[Endpoint, Any, Any], Awaitable[T]],
        args: Any,
        kwargs: Any,
        timeout: float | None,
    ) -> Awaitable[T]:
        """The coroutine of a Future: `method` on this endpoint, or on it with `timeout`."""
        return method(self if timeout is None else self.with_timeout(timeout), args, kwargs)

    async def _call(self, args: Any, kwargs: Any) -> ValueMesh[Any]:
        slots = self._owner.slots
        outcomes = await self._now(slots, args, kwargs)
        if outcomes is None:
            outcomes = await self._outcomes(slots, args, kwargs)
        return ValueMesh(self._owner.shape, [unwrap(o) for o in outcomes])

    async def _call_one(self, args: Any, kwargs: Any) -> Any:
        slots = self._owner.slots
        if self._timeout is None and self._retry is NO_RETRY and slots[0].up:
            # ``_now`` for one actor, written out: this is ``ref.ep(x)``, the hottest path.
            node, slot = calling_node(), slots[0]
            version = slot.version
            group = node.call_now(slots, [slot.actor_id], self._name, args, kwargs)
            if group is not None:
                try:
                    await group.wait_all()
                finally:
                    node.ended(slots, group)
                ok, value = group.results[0]
                if ok:
                    return value
                if not resendable(slot, value):
                    raise value
                return unwrap((await self._outcomes(slots, args, kwargs, [version]))[0])
        return unwrap((await self._outcomes(slots, args, kwargs))[0])

    async def _now(
        self, slots: list[Slot], args: Any, kwargs: Any
    ) -> list[tuple[bool, Any]] | None:
        """The hot path: every actor up, no timeout to keep, no re-send to count, each in
        another process with its connection open (``Outgoing.call_now``): one packing, no
        attempt bookkeeping, no coroutine per actor. None, nothing sent, when the general way
        must do it; a reply that says the call never reached its actor (it was restarting) is
        sent again that way, to the next incarnation."""
        if self._timeout is not None or self._retry is not NO_RETRY:
            return None
        versions = []
        for slot in slots:
            if not slot.up:
                return None
            versions.append(slot.version)
        node = calling_node()
        group = node.call_now(slots, [s.actor_id for s in slots], self._name, args, kwargs)
        if group is None:
            return None
        try:
            await group.wait_all()
        finally:
            node.ended(slots, group)
        outcomes: list[tuple[bool, Any]] = group.results
        again = [
            i for i, (ok, value) in enumerate(outcomes) if not ok and resendable(slots[i], value)
        ]
        if again:
            resent = await self._outcomes(
                [slots[i] for i in again], args, kwargs, [versions[i] for i in again]
            )
            for i, outcome in zip(again, resent, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _choose(self, args: Any, kwargs: Any) -> Any:
        node = calling_node()
        slots = self._owner.slots
        live = [s for s in slots if s.up and s.dead_reason() is None] or slots
        least = min(node.inflight.get(s.actor_id, 0) for s in live)
        candidates = [s for s in live if node.inflight.get(s.actor_id, 0) == least]
        chosen = candidates[next(_round_robin) % len(candidates)]
        return unwrap((await self._outcomes([chosen], args, kwargs))[0])

    async def _broadcast(self, args: Any, kwargs: Any) -> None:
        await calling_node().cast(self._owner.slots, self._name, args, kwargs)


class Reduction(Generic[R]):
    """``mesh.ep.reduce(combine, initial)``: call it with the endpoint's arguments to get the
    reduced value (a Future). Its own settings are given apart, so none can be mistaken for an
    argument of the endpoint."""

    __slots__ = ("_combine", "_endpoint", "_initial")

    def __init__(self, endpoint: Endpoint, combine: Callable[[R, Any], R], initial: R) -> None:
        self._endpoint, self._combine, self._initial = endpoint, combine, initial

    def __call__(self, *args: Any, **kwargs: Any) -> Future[R]:
        endpoint = self._endpoint
        endpoint._bind(args, kwargs)
        method = partial(_reduce_with, self._combine, self._initial)  # once per reduction
        return Future(Endpoint._begin, endpoint, method, args, kwargs)

    def with_timeout(self, seconds: float | None) -> Reduction[R]:
        return Reduction(self._endpoint.with_timeout(seconds), self._combine, self._initial)


def _reduce_with(
    combine: Callable[[R, Any], R], initial: R, endpoint: Endpoint, args: Any, kwargs: Any
) -> Awaitable[R]:
    return endpoint._reduce(combine, initial, args, kwargs)


_round_robin = itertools.count()


# ---------------------------------------------------------------- for gather (_gather.py)


def send_into(
    node: Node, group: CallGroup, index: int, start: Callable[..., Any], args: tuple[Any, ...]
) -> Slot | None:
    """Send the call of a ``call_one`` Future (its start and arguments: ``_future.take``) into
    entry `index` of `group` here and now, where ``_call_one``'s hot path would: the slot it
    went to; None, with nothing sent, when it must go the general way (``await`` the Future)."""
    if start is not Endpoint._begin or args[1] is not Endpoint._call_one:
        return None
    endpoint, _, call_args, call_kwargs = args
    slot: Slot = endpoint._owner.slots[0]
    if endpoint._timeout is not None or endpoint._retry is not NO_RETRY or not slot.up:
        return None
    group.paths[index] = slot.actor_id
    if not node.call_into(group, index, slot, endpoint._name, call_args, call_kwargs):
        return None
    return slot


def resend(
    args: tuple[Any, ...], slot: Slot, version: int, error: Any
) -> Callable[[], Awaitable[list[tuple[bool, Any]]]] | None:
    """What ``_call_one`` does after its hot path failed with `error`: a call that never
    reached its supervised actor goes the general way to the next incarnation (newer than
    `version`); None when `error` is the call's outcome."""
    if not resendable(slot, error):
        return None
    endpoint, _, call_args, call_kwargs = args
    return partial(endpoint._outcomes, [slot], call_args, call_kwargs, [version])
