"""Actor meshes and actor refs: how a caller reaches actors, and what calls return.

A mesh is a shape plus one slot per point. A slot names an actor (its path) and where it lives;
slots are shared by a mesh, its slices and its refs, so when the runtime moves an actor (a
restart in a new process) every holder follows.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

import trio

from .._core._errors import ActorDiedError, CallTimeoutError, MeshError, ProtocolError
from .._core._shape import Coords, Shape, all_coords, select
from .._core._signature import Endpoints, bind_error
from .._core._valuemesh import ValueMesh as ValueMesh
from .._wire import _codec, _payloads
from ._aioloop import bridge
from ._ask import ask_controller
from ._calls import CallGroup
from ._lost import NO_RETRY, LostRetry
from ._node import Node, current_node
from ._slot import Slot as Slot


def _node() -> Node:
    """This trio run's node: the one the refs and meshes it made call through."""
    node = current_node()
    if node is None:
        raise MeshError(
            "no otpmesh node is running in this trio run: refs and meshes work inside actors "
            "and in the run that made them (otpmesh.proc_mesh() or otpmesh.start())"
        )
    return node


class _Caller:
    """What endpoints need from a mesh or a ref: its slots, shape and a default timeout."""

    __slots__ = ("_endpoints", "_name", "_shape", "_slots", "_timeout")

    def __init__(
        self,
        name: str,
        endpoints: Endpoints,
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
    _wire_ext: ClassVar[int] = _codec.EXT_ACTOR_MESH  # how it travels (see _codec)

    def _to_wire(self) -> list[Any]:
        slots = [_slot_to_data(s) for s in self._slots]
        return [
            self._name,
            self._endpoints.to_wire(),
            list(self._shape.items()),
            slots,
            self._timeout,
        ]

    @classmethod
    def _from_wire(cls, data: Any) -> ActorMesh:
        # Checked before anything is built: ProtocolError for a malformed one (_payloads.py).
        name, endpoints, pairs, slots, timeout = _payloads.fields(data, "actor mesh", _MESH_FIELDS)
        shape = _payloads.mesh_shape(pairs, len(slots), "actor mesh")
        return cls(
            name,
            Endpoints.from_wire(_payloads.endpoints(endpoints, "actor mesh's endpoints")),
            shape,
            [_slot_from_data(s) for s in slots],
            _wire_timeout(timeout),
        )

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

    async def stop(self) -> None:
        """Stop this mesh's actors (each runs ``on_stop``); their processes stay. For a mesh
        spawned on a proc mesh (``spawn`` or ``spawn_supervised``), from any process of the app;
        a mesh declared in a tree is stopped by its supervisor (``app.terminate_child``).
        Stopping a stopped mesh is an error."""
        await ask_controller("mesh_stop", {"path": self._name})

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
    _wire_ext: ClassVar[int] = _codec.EXT_ACTOR_REF  # how it travels (see _codec)

    def _to_wire(self) -> list[Any]:
        return [self._name, self._endpoints.to_wire(), _slot_to_data(self._slots[0]), self._timeout]

    @classmethod
    def _from_wire(cls, data: Any) -> ActorRef:
        # Checked before anything is built: ProtocolError for a malformed one (_payloads.py).
        name, endpoints, slot, timeout = _payloads.fields(data, "actor ref", _REF_FIELDS)
        checked = Endpoints.from_wire(_payloads.endpoints(endpoints, "actor ref's endpoints"))
        return cls(name, checked, _slot_from_data(slot), _wire_timeout(timeout))

    def __init__(
        self, name: str, endpoints: Endpoints, slot: Slot, timeout: float | None = None
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
    """One endpoint of a mesh or ref; the ways to call it. Each checks its arguments against the
    endpoint's signature first: TypeError here when they do not bind, and nothing is sent."""

    __slots__ = ("_name", "_owner", "_params", "_retry", "_timeout")

    def __init__(
        self, owner: _Caller, name: str, timeout: float | None, retry: LostRetry = NO_RETRY
    ) -> None:
        self._owner = owner
        self._name = name
        self._timeout = timeout
        self._retry = retry
        self._params = owner._endpoints.params(name)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        params = self._params
        if params is not None:
            problem = params.problem(len(args), kwargs)
            if problem is not None:
                owner = self._owner
                who = owner.path if isinstance(owner, ActorRef) else owner._name
                raise TypeError(bind_error(who, self._name, params, problem))

    def with_timeout(self, seconds: float | None) -> Endpoint:
        """This endpoint with a timeout: on expiry a call raises CallTimeoutError naming actors."""
        return Endpoint(self._owner, self._name, _check_timeout(seconds), self._retry)

    def with_retry(self, *, lost: int) -> Endpoint:
        """This endpoint, whose calls send a member's call again to its actor's next incarnation
        when the call reached the actor and was lost with it (the actor died before it replied),
        up to `lost` times per member; the other members' results are kept, so nothing that
        answered runs twice. Only for an endpoint that is safe to run again: idempotent, or its
        effect lost with the actor. Unsupervised or permanently gone actors fail as before."""
        return Endpoint(self._owner, self._name, self._timeout, LostRetry(lost))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """On a mesh: ``call`` (a ValueMesh). On an actor ref: ``call_one`` (the value)."""
        if isinstance(self._owner, ActorRef):
            return self.call_one(*args, **kwargs)
        return self.call(*args, **kwargs)

    async def call(self, *args: Any, **kwargs: Any) -> ValueMesh[Any]:
        """Call every actor; return their values by coordinates. Raises the first error by rank."""
        aio = bridge()  # called from an asyncio actor: the call itself runs in trio
        if aio is not None:
            return await aio.to_trio(self.call, *args, **kwargs)
        self._bind(args, kwargs)
        outcomes = await self._outcomes(self._owner._slots, args, kwargs)
        return ValueMesh(self._owner._shape, [_value(o) for o in outcomes])

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """Call the one actor of a single-actor mesh or ref and return its value."""
        aio = bridge()
        if aio is not None:
            return await aio.to_trio(self.call_one, *args, **kwargs)
        self._bind(args, kwargs)
        slots = self._owner._slots
        if len(slots) != 1:
            raise MeshError(
                f"call_one on {self._owner._name} of {len(slots)} actors: index one actor "
                f"(mesh[i].{self._name}.call_one(...)) or use .call(...) for all of them"
            )
        return _value((await self._outcomes(slots, args, kwargs))[0])

    async def choose(self, *args: Any, **kwargs: Any) -> Any:
        """Call exactly one actor, the one with the fewest calls in flight from this process."""
        aio = bridge()
        if aio is not None:
            return await aio.to_trio(self.choose, *args, **kwargs)
        self._bind(args, kwargs)
        node = _node()
        slots = self._owner._slots
        live = [s for s in slots if s.up and s.dead_reason() is None] or slots
        least = min(node.inflight.get(s.actor_id, 0) for s in live)
        candidates = [s for s in live if node.inflight.get(s.actor_id, 0) == least]
        chosen = candidates[next(_round_robin) % len(candidates)]
        return _value((await self._outcomes([chosen], args, kwargs))[0])

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[Coords, Any]]:
        """Call every actor; yield (coordinates, value) as replies arrive. Errors raise in turn."""
        if bridge() is not None:
            raise MeshError(
                f"{self._name}.stream() is not available in an asyncio actor's code: use "
                f"await {self._name}.call(...) (one ValueMesh) or call each actor in its own task"
            )
        self._bind(args, kwargs)
        slots = self._owner._slots
        coords = all_coords(self._owner._shape)
        send, receive = trio.open_memory_channel[tuple[int, tuple[bool, Any]]](len(slots))

        async def one(index: int) -> None:
            try:
                outcome = (await self._outcomes([slots[index]], args, kwargs))[0]
            except Exception as exc:  # a timeout: delivered in turn like any error
                outcome = (False, exc)
            send.send_nowait((index, outcome))

        async with trio.open_nursery() as nursery:
            for index in range(len(slots)):
                nursery.start_soon(one, index)
            for _ in range(len(slots)):
                index, outcome = await receive.receive()
                yield coords[index], _value(outcome)

    async def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting for results (FIFO with later calls from here)."""
        aio = bridge()
        if aio is not None:
            return await aio.to_trio(self.broadcast, *args, **kwargs)
        self._bind(args, kwargs)
        node = _node()
        await node.cast(self._owner._slots, self._name, args, kwargs)

    async def _outcomes(self, slots: list[Slot], args: Any, kwargs: Any) -> list[tuple[bool, Any]]:
        """(ok, value-or-error) per slot, within this endpoint's timeout."""
        attempt = _Attempt()
        if self._timeout is None:
            return await self._gather(slots, args, kwargs, attempt)
        with trio.move_on_after(self._timeout):
            return await self._gather(slots, args, kwargs, attempt)
        raise CallTimeoutError(attempt.late(), self._name, self._timeout)

    async def _gather(
        self, slots: list[Slot], args: Any, kwargs: Any, attempt: _Attempt
    ) -> list[tuple[bool, Any]]:
        # A call that never reached a supervised actor (it was restarting) is sent again to the
        # next incarnation; a call that reached it and lost it reports the failure, unless
        # this endpoint was made `with_retry(lost=...)` and the member has re-sends left.
        node = _node()
        lost = self._retry.budget(len(slots))
        results: list[tuple[bool, Any]] = [(False, None)] * len(slots)
        todo = list(range(len(slots)))
        seen = [-1] * len(slots)
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
                group.forget()
                node.done(batch)
                if group.offered and node.channel is not None:
                    node.channel.drop_offered(group.offered)
            retry = []
            for j, i in enumerate(todo):
                ok, value = group.results[j]
                if not ok and (_resendable(slots[i], value) or lost.take(i, slots[i], value)):
                    retry.append(i)
                else:
                    results[i] = (ok, value)
            todo = retry
        return results


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


# The fields of refs, meshes and slots as they travel (see their ``_to_wire``).
_SLOT_FIELDS = (_payloads.STR, _payloads.STR, _payloads.BOOL)  # actor id, address, supervised
_TIMEOUT = _payloads.OPTIONAL_NUMBER
# name, endpoints, slot, timeout
_REF_FIELDS = (_payloads.STR, _payloads.LIST, _payloads.LIST, _TIMEOUT)
# name, endpoints, shape pairs, slots, timeout
_MESH_FIELDS = (_payloads.STR, _payloads.LIST, _payloads.LIST, _payloads.LIST, _TIMEOUT)


def _wire_timeout(seconds: float | None) -> float | None:
    if seconds is not None and not seconds > 0:
        raise ProtocolError(f"malformed timeout {seconds!r}: a positive number of seconds or null")
    return seconds


def _slot_to_data(slot: Slot) -> list[Any]:
    return [slot.actor_id, slot.addr, slot.supervised]


def _slot_from_data(data: Any) -> Slot:
    actor_id, addr, supervised = _payloads.fields(data, "actor slot", _SLOT_FIELDS)
    # Received in a message: this process has no supervisor's view of it, so a supervised
    # slot that moved is looked up again through the controller (Node.resolve).
    return Slot(actor_id, addr, supervised=supervised, remote=True)
