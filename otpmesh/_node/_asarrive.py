"""The ways of a call that take replies as they arrive, not all at once: ``stream`` (each
value as it comes) and ``reduce`` (folded as they come), each actor called in a task of its own.
``RepliesAsTheyCome`` is that part of ``Endpoint`` (_endpoint.py; its state is the
endpoint's)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

from .._core._errors import MeshError
from .._core._shape import Coords, Shape, all_coords
from .._wire._owntasks import spawn as spawn_own
from ._aioloop import bridge
from ._attempts import unwrap
from ._slot import Slot

R = TypeVar("R")


class Called(Protocol):
    """What an endpoint calls (``Target``, _endpoint.py): its slots and shape."""

    shape: Shape
    slots: list[Slot]


class RepliesAsTheyCome:
    """Every actor called in its own task, each outcome handed on as it arrives."""

    __slots__ = ()

    _name: str
    _owner: Called
    _bind: Callable[[tuple[Any, ...], dict[str, Any]], None]
    #: The general way (_attempts.py): (ok, value-or-error) per slot.
    _outcomes: Callable[[list[Slot], Any, Any], Awaitable[list[tuple[bool, Any]]]]

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
                    accumulated = combine(accumulated, unwrap(outcome))
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
                yield coords[index], unwrap(outcome)
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
