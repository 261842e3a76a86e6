"""Actor meshes and actor refs: how a caller reaches actors, and what calls return.

A mesh is a shape plus one slot per point. A slot names an actor (its path) and where it lives;
slots are shared by a mesh, its slices and its refs, so when the runtime moves an actor (a
restart in a new process) every holder follows.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from . import _codec
from ._calls import CallGroup
from ._errors import CallTimeoutError, MeshError
from ._node import Node, current_node
from ._shape import Coords, Shape, all_coords, rank_of, select

if TYPE_CHECKING:
    from ._runtime import Proc

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Slot:
    """One actor of a mesh: its path, where it lives now, and (on the controller) its process."""

    actor_id: str
    addr: str
    proc: Proc | None = None

    def dead_reason(self) -> str | None:
        if self.proc is not None and not self.proc.alive:
            return self.proc.death()
        return None


class ValueMesh(Generic[T]):
    """The values of a mesh call, one per actor, by coordinates; iterates in rank order."""

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: list[T]) -> None:
        self._shape = dict(shape)
        self._values = values

    @property
    def shape(self) -> Shape:
        return dict(self._shape)

    def item(self, **coords: int) -> T:
        """The value at `coords` (all dimensions); no arguments when the mesh holds one value."""
        if not coords:
            if len(self._values) != 1:
                raise MeshError(
                    f"item() without coordinates needs a single value; this ValueMesh has "
                    f"{len(self._values)} (shape {self._shape}): give e.g. "
                    f"item({', '.join(f'{d}=0' for d in self._shape)})"
                )
            return self._values[0]
        return self._values[rank_of(self._shape, coords)]

    def values(self) -> list[T]:
        return list(self._values)

    def items(self) -> Iterator[tuple[Coords, T]]:
        return zip(all_coords(self._shape), self._values, strict=True)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, rank: int) -> T:
        return self._values[rank]

    def __repr__(self) -> str:
        return f"ValueMesh({self._shape}, {self._values!r})"


async def _start_runtime() -> Node:
    from ._runtime import runtime

    return (await runtime()).node


class _Caller:
    """What endpoints need from a mesh or a ref: its slots, shape and a default timeout."""

    __slots__ = ("_endpoints", "_name", "_shape", "_slots", "_timeout")

    def __init__(
        self,
        name: str,
        endpoints: frozenset[str],
        shape: Shape,
        slots: list[Slot],
        timeout: float | None,
    ) -> None:
        self._name = name
        self._endpoints = endpoints
        self._shape = shape
        self._slots = slots
        self._timeout = timeout

    def endpoint(self, name: str) -> Endpoint:
        """The endpoint called `name` (the same as attribute access, for names that clash)."""
        if self._endpoints and name not in self._endpoints:
            raise AttributeError(
                f"{self._name} has no endpoint {name!r} (endpoints: "
                f"{', '.join(sorted(self._endpoints)) or 'none'})"
            )
        return Endpoint(self, name, self._timeout)

    def __getattr__(self, name: str) -> Endpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.endpoint(name)

    @property
    def shape(self) -> Shape:
        return dict(self._shape)

    @property
    def paths(self) -> list[str]:
        return [slot.actor_id for slot in self._slots]

    def __len__(self) -> int:
        return len(self._slots)


class ActorMesh(_Caller):
    """The actors of one class spawned on every process of a mesh. Call an endpoint on all of
    them (``await mesh.ep(x)``), or index or slice it to reach fewer."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self._name

    def __getitem__(self, rank: int) -> ActorRef:
        n = len(self._slots)
        if not -n <= rank < n:
            raise IndexError(f"rank {rank} is out of range for {self._name} of {n} actors")
        return ActorRef(self._name, self._endpoints, self._slots[rank], self._timeout)

    def __iter__(self) -> Iterator[ActorRef]:
        return (self[i] for i in range(len(self._slots)))

    def slice(self, **selection: int | slice) -> ActorMesh:
        """A sub-mesh: ``gpus=0`` drops the dimension, ``gpus=slice(0, 2)`` keeps part of it."""
        shape, ranks = select(self._shape, **selection)
        return ActorMesh(
            self._name, self._endpoints, shape, [self._slots[r] for r in ranks], self._timeout
        )

    def with_timeout(self, seconds: float | None) -> ActorMesh:
        """The same mesh whose calls time out after `seconds` by default."""
        return ActorMesh(
            self._name, self._endpoints, self._shape, self._slots, _check_timeout(seconds)
        )

    def __repr__(self) -> str:
        return f"ActorMesh({self._name!r}, shape={self._shape})"


class ActorRef(_Caller):
    """One actor. ``await ref.ep(x)`` returns its value. Serializable: pass it in messages."""

    __slots__ = ()

    def __init__(
        self, name: str, endpoints: frozenset[str], slot: Slot, timeout: float | None = None
    ) -> None:
        super().__init__(name, endpoints, {}, [slot], timeout)

    @property
    def path(self) -> str:
        return self._slots[0].actor_id

    def with_timeout(self, seconds: float | None) -> ActorRef:
        return ActorRef(self._name, self._endpoints, self._slots[0], _check_timeout(seconds))

    def __repr__(self) -> str:
        return f"ActorRef({self.path!r})"


def _check_timeout(seconds: float | None) -> float | None:
    if seconds is not None and (not isinstance(seconds, int | float) or not seconds > 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, not {seconds!r}")
    return seconds


class Endpoint:
    """One endpoint of a mesh or ref; the ways to call it."""

    __slots__ = ("_name", "_owner", "_timeout")

    def __init__(self, owner: _Caller, name: str, timeout: float | None) -> None:
        self._owner = owner
        self._name = name
        self._timeout = timeout

    def with_timeout(self, seconds: float | None) -> Endpoint:
        """This endpoint with a timeout: on expiry a call raises CallTimeoutError naming actors."""
        return Endpoint(self._owner, self._name, _check_timeout(seconds))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """On a mesh: ``call`` (a ValueMesh). On an actor ref: ``call_one`` (the value)."""
        if isinstance(self._owner, ActorRef):
            return self.call_one(*args, **kwargs)
        return self.call(*args, **kwargs)

    async def call(self, *args: Any, **kwargs: Any) -> ValueMesh[Any]:
        """Call every actor; return their values by coordinates. Raises the first error by rank."""
        slots = self._owner._slots
        group = await self._start(slots, args, kwargs)
        try:
            await self._wait(group, group.wait_all)
        finally:
            self._finish(group, slots)
        return ValueMesh(self._owner._shape, [group.outcome(i) for i in range(len(slots))])

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """Call the one actor of a single-actor mesh or ref and return its value."""
        slots = self._owner._slots
        if len(slots) != 1:
            raise MeshError(
                f"call_one on {self._owner._name} of {len(slots)} actors: index one actor "
                f"(mesh[i].{self._name}.call_one(...)) or use .call(...) for all of them"
            )
        return await self._call_slot(slots[0], args, kwargs)

    async def choose(self, *args: Any, **kwargs: Any) -> Any:
        """Call exactly one actor, the one with the fewest calls in flight from this process."""
        node = current_node() or await _start_runtime()
        slots = self._owner._slots
        live = [s for s in slots if s.dead_reason() is None] or slots
        least = min(node.inflight.get(s.actor_id, 0) for s in live)
        candidates = [s for s in live if node.inflight.get(s.actor_id, 0) == least]
        return await self._call_slot(candidates[next(_round_robin) % len(candidates)], args, kwargs)

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[Coords, Any]]:
        """Call every actor; yield (coordinates, value) as replies arrive. Errors raise in turn."""
        slots = self._owner._slots
        coords = all_coords(self._owner._shape)
        group = await self._start(slots, args, kwargs)
        try:
            for _ in range(len(slots)):
                index = await self._wait(group, group.wait_next)
                yield coords[index], group.outcome(index)
        finally:
            self._finish(group, slots)

    async def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting for results (FIFO with later calls from here)."""
        node = current_node() or await _start_runtime()
        await node.cast(self._owner._slots, self._name, args, kwargs)

    async def _call_slot(self, slot: Slot, args: Any, kwargs: Any) -> Any:
        group = await self._start([slot], args, kwargs)
        try:
            await self._wait(group, group.wait_all)
        finally:
            self._finish(group, [slot])
        return group.outcome(0)

    async def _start(self, slots: list[Slot], args: Any, kwargs: Any) -> CallGroup:
        node = current_node() or await _start_runtime()
        return await node.call(slots, [s.actor_id for s in slots], self._name, args, kwargs)

    async def _wait(self, group: CallGroup, waiter: Any) -> Any:
        if self._timeout is None:
            return await waiter()
        with trio.move_on_after(self._timeout):
            return await waiter()
        late = [group.paths[i] for i in group.missing()]
        raise CallTimeoutError(late, self._name, self._timeout)

    def _finish(self, group: CallGroup, slots: list[Slot]) -> None:
        group.forget()
        node = current_node()
        if node is not None:
            node.done(slots)


_round_robin = itertools.count()


def _mesh_to_data(mesh: ActorMesh) -> list[Any]:
    return [
        mesh._name,
        sorted(mesh._endpoints),
        list(mesh._shape.items()),
        [[s.actor_id, s.addr] for s in mesh._slots],
        mesh._timeout,
    ]


def _mesh_from_data(data: list[Any]) -> ActorMesh:
    name, endpoints, shape, slots, timeout = data
    return ActorMesh(
        name, frozenset(endpoints), dict(shape), [Slot(a, b) for a, b in slots], timeout
    )


def _ref_to_data(ref: ActorRef) -> list[Any]:
    slot = ref._slots[0]
    return [ref._name, sorted(ref._endpoints), slot.actor_id, slot.addr, ref._timeout]


def _ref_from_data(data: list[Any]) -> ActorRef:
    name, endpoints, actor_id, addr, timeout = data
    return ActorRef(name, frozenset(endpoints), Slot(actor_id, addr), timeout)


_codec.register_ext(
    ValueMesh,
    _codec.EXT_VALUE_MESH,
    lambda vm: [list(vm._shape.items()), vm._values],
    lambda data: ValueMesh(dict(data[0]), data[1]),
)
_codec.register_ext(ActorMesh, _codec.EXT_ACTOR_MESH, _mesh_to_data, _mesh_from_data)
_codec.register_ext(ActorRef, _codec.EXT_ACTOR_REF, _ref_to_data, _ref_from_data)
