"""Endpoints: the ways to call actors (call, call_one, choose, broadcast, stream, reduce).

Each way returns a Future (``_future.py``) whose coroutine is made only when it is awaited or
waited for, with the endpoint's timeout or the one ``get(timeout)`` gives. A call that never
reached a supervised actor (it was restarting) is sent again to its next incarnation; one that
reached it and lost it reports the failure: every way follows that rule, reductions included.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Generic, TypeVar

import trio

from .._core._errors import ActorDiedError, CallTimeoutError, MeshError
from .._core._shape import Coords, Shape, all_coords
from .._core._signature import Params, bind_error
from .._core._valuemesh import ValueMesh
from .._wire._owntasks import spawn as spawn_own
from ._aioloop import bridge
from ._calls import CallGroup
from ._future import Future
from ._lost import NO_RETRY, LostRetry
from ._node import Node, current_node
from ._slot import Slot

T = TypeVar("T")
R = TypeVar("R")


def _node() -> Node:
    """This trio run's node: the one the refs and meshes it made call through."""
    node = current_node()
    if node is None:
        raise MeshError(
            "no otpmesh node is running in this trio run: refs and meshes work inside actors "
            "and in the run that made them (otpmesh.proc_mesh() or otpmesh.start())"
        )
    return node


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


class Endpoint:
    """One endpoint of a mesh or ref; the ways to call it. Each checks its arguments against the
    endpoint's signature first: TypeError here when they do not bind, and nothing is sent."""

    __slots__ = ("_name", "_owner", "_params", "_retry", "_timeout")

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
        return ValueMesh(self._owner.shape, [_value(o) for o in outcomes])

    async def _call_one(self, args: Any, kwargs: Any) -> Any:
        slots = self._owner.slots
        if self._timeout is None and self._retry is NO_RETRY and slots[0].up:
            # ``_now`` for one actor, written out: this is ``ref.ep(x)``, the hottest path.
            node, slot = _node(), slots[0]
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
                if not _resendable(slot, value):
                    raise value
                return _value((await self._outcomes(slots, args, kwargs, [version]))[0])
        return _value((await self._outcomes(slots, args, kwargs))[0])

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
        node = _node()
        group = node.call_now(slots, [s.actor_id for s in slots], self._name, args, kwargs)
        if group is None:
            return None
        try:
            await group.wait_all()
        finally:
            node.ended(slots, group)
        outcomes: list[tuple[bool, Any]] = group.results
        again = [
            i for i, (ok, value) in enumerate(outcomes) if not ok and _resendable(slots[i], value)
        ]
        if again:
            resent = await self._outcomes(
                [slots[i] for i in again], args, kwargs, [versions[i] for i in again]
            )
            for i, outcome in zip(again, resent, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _choose(self, args: Any, kwargs: Any) -> Any:
        node = _node()
        slots = self._owner.slots
        live = [s for s in slots if s.up and s.dead_reason() is None] or slots
        least = min(node.inflight.get(s.actor_id, 0) for s in live)
        candidates = [s for s in live if node.inflight.get(s.actor_id, 0) == least]
        chosen = candidates[next(_round_robin) % len(candidates)]
        return _value((await self._outcomes([chosen], args, kwargs))[0])

    async def _broadcast(self, args: Any, kwargs: Any) -> None:
        await _node().cast(self._owner.slots, self._name, args, kwargs)

    async def _reduce(
        self, combine: Callable[[R, Any], R], initial: R, args: Any, kwargs: Any
    ) -> R:
        slots = self._owner.slots
        accumulated, error = initial, None
        send, arrivals = trio.open_memory_channel[tuple[int, tuple[bool, Any]]](len(slots))
        async with trio.open_nursery() as nursery:
            self._fan_out(nursery, slots, args, kwargs, send)
            for _ in slots:
                _, outcome = await arrivals.receive()
                try:
                    accumulated = combine(accumulated, _value(outcome))
                except Exception as exc:  # raised below, outside the nursery (not in a group)
                    error = exc
                    nursery.cancel_scope.cancel()
                    break
        if error is not None:
            raise error
        return accumulated

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[Coords, Any]]:
        """Call every actor; yield (coordinates, value) as replies arrive. Errors raise in turn."""
        if bridge() is not None:
            raise MeshError(
                f"{self._name}.stream() is not available in an asyncio actor's code: use "
                f"await {self._name}.call(...) (one ValueMesh) or call each actor in its own task"
            )
        self._bind(args, kwargs)
        slots = self._owner.slots
        coords = all_coords(self._owner.shape)
        # The calls run in a system task, not in a nursery held open across the yields: a
        # generator left unfinished (a `break`, an error in the loop's body) is closed later
        # from another task, which must not be asked to exit a cancel scope of this one.
        send, arrivals = trio.open_memory_channel[tuple[int, tuple[bool, Any]]](len(slots))
        calls = trio.CancelScope()

        async def fan_out() -> None:
            with calls:
                async with trio.open_nursery() as nursery:
                    self._fan_out(nursery, slots, args, kwargs, send)

        spawn_own(fan_out, name=f"otpmesh: {self._name}.stream()")
        try:
            for _ in range(len(slots)):
                index, outcome = await arrivals.receive()
                yield coords[index], _value(outcome)
        finally:
            calls.cancel()  # the calls still out end with the loop

    def _fan_out(
        self,
        nursery: trio.Nursery,
        slots: list[Slot],
        args: Any,
        kwargs: Any,
        send: trio.MemorySendChannel[tuple[int, tuple[bool, Any]]],
    ) -> None:
        """Call each of `slots` in a task of `nursery`; (index, outcome) pairs into `send` (room
        for every slot's) as they arrive."""

        async def one(index: int) -> None:
            try:
                outcome = (await self._outcomes([slots[index]], args, kwargs))[0]
            except Exception as exc:  # a timeout: delivered in turn like any error
                outcome = (False, exc)
            send.send_nowait((index, outcome))

        for index in range(len(slots)):
            nursery.start_soon(one, index)

    async def _outcomes(
        self, slots: list[Slot], args: Any, kwargs: Any, seen: list[int] | None = None
    ) -> list[tuple[bool, Any]]:
        """(ok, value-or-error) per slot, within this endpoint's timeout; `seen`: the slots'
        versions a first attempt was sent to (its share is sent to a newer one)."""
        attempt = _Attempt()
        if seen is None:
            seen = [-1] * len(slots)
        if self._timeout is None:
            return await self._gather(slots, args, kwargs, attempt, seen)
        with trio.move_on_after(self._timeout):
            return await self._gather(slots, args, kwargs, attempt, seen)
        raise CallTimeoutError(attempt.late(), self._name, self._timeout)

    async def _gather(
        self, slots: list[Slot], args: Any, kwargs: Any, attempt: _Attempt, seen: list[int]
    ) -> list[tuple[bool, Any]]:
        # A call that never reached a supervised actor (it was restarting) is sent again to the
        # next incarnation; a call that reached it and lost it reports the failure, unless
        # this endpoint was made `with_retry(lost=...)` and the member has re-sends left.
        node = _node()
        lost = self._retry.budget(len(slots))
        results: list[tuple[bool, Any]] = [(False, None)] * len(slots)
        todo = list(range(len(slots)))
        while todo:
            attempt.group, attempt.paths = None, [slots[i].actor_id for i in todo]
            for i in todo:
                if slots[i].remote and seen[i] >= 0:
                    await node.resolve(slots[i])
                else:
                    await slots[i].wait_up(seen[i])
                seen[i] = slots[i].version
            batch = [slots[i] for i in todo]
            group = await node.call(batch, attempt.paths, self._name, args, kwargs)
            attempt.group = group
            try:
                await group.wait_all()
            finally:
                node.ended(batch, group)
            retry = []
            for j, i in enumerate(todo):
                ok, value = group.results[j]
                if not ok and (_resendable(slots[i], value) or lost.take(i, slots[i], value)):
                    retry.append(i)
                else:
                    results[i] = (ok, value)
            todo = retry
        return results


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


class _Attempt:
    """The slots a call is still waiting for, to name them if it times out."""

    __slots__ = ("group", "paths")

    def __init__(self) -> None:
        self.group: CallGroup | None = None
        self.paths: list[str] = []

    def late(self) -> list[str]:
        if self.group is None:
            return self.paths
        return [self.group.paths[i] for i in self.group.missing()]


def _resendable(slot: Slot, error: Any) -> bool:
    return (
        isinstance(error, ActorDiedError)
        and not error.delivered
        and slot.supervised
        and slot.gone is None
    )


def _value(outcome: tuple[bool, Any]) -> Any:
    ok, value = outcome
    if ok:
        return value
    raise value


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
    if not _resendable(slot, error):
        return None
    endpoint, _, call_args, call_kwargs = args
    return partial(endpoint._outcomes, [slot], call_args, call_kwargs, [version])
