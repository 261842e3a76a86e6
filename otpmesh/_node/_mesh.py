"""Actor meshes and actor refs: how a caller reaches actors, and what calls return.

A mesh is a shape plus one slot per point. A slot names an actor (its path) and where it lives;
slots are shared by a mesh, its slices and its refs, so when the runtime moves an actor (a
restart in a new process) every holder follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from .._core._errors import ProtocolError
from .._core._shape import Shape, select
from .._core._signature import Endpoints
from .._core._valuemesh import ValueMesh as ValueMesh
from .._wire import _codec, _payloads
from ._ask import ask_controller
from ._endpoint import Endpoint as Endpoint
from ._endpoint import Reduction as Reduction
from ._endpoint import Target, check_timeout
from ._future import Future, later
from ._slot import Slot as Slot

# Endpoints kept per mesh or ref (a caller that names endpoints without end, through
# ``endpoint(name)`` on an actor of unknown endpoints, keeps no more than this).
_KEPT_ENDPOINTS = 64


class _Caller:
    """What endpoints need from a mesh or a ref: its slots, shape and a default timeout."""

    __slots__ = ("_endpoints", "_made", "_name", "_shape", "_slots", "_target", "_timeout")

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
        self._target = Target(name, shape, slots, single=isinstance(self, ActorRef))
        self._made: dict[str, Endpoint] = {}  # endpoints are immutable: one per name is kept

    def endpoint(self, name: str) -> Endpoint:
        """The endpoint called `name` (the same as attribute access, for names that clash)."""
        made = self._made.get(name)
        if made is not None:
            return made
        if self._endpoints and name not in self._endpoints:
            raise AttributeError(
                f"{self._name} has no endpoint {name!r} (endpoints: "
                f"{', '.join(sorted(self._endpoints)) or 'none'})"
            )
        made = Endpoint(self._target, name, self._endpoints.params(name), self._timeout)
        if len(self._made) < _KEPT_ENDPOINTS:
            self._made[name] = made
        return made

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

    def flatten(self, name: str) -> ActorMesh:
        """The same actors along one dimension `name`, in rank order (``mesh.flatten("rank")``
        then ``.slice(rank=0)``)."""
        return ActorMesh(
            self._name, self._endpoints, {name: len(self._slots)}, self._slots, self._timeout
        )

    def stop(self) -> Future[None]:
        """Stop this mesh's actors (each runs ``on_stop``); their processes stay. For a mesh
        spawned on a proc mesh (``spawn`` or ``spawn_supervised``), from any process of the app;
        a mesh declared in a tree is stopped by its supervisor (``app.terminate_child``).
        Stopping a stopped mesh is an error."""
        return later(f"stopping {self._name}", ask_controller, "mesh_stop", {"path": self._name})

    def with_timeout(self, seconds: float | None) -> ActorMesh:
        """The same mesh whose calls time out after `seconds` by default."""
        return ActorMesh(
            self._name, self._endpoints, self._shape, self._slots, check_timeout(seconds)
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
        return ActorRef(self._name, self._endpoints, self._slots[0], check_timeout(seconds))

    def __repr__(self) -> str:
        return f"ActorRef({self.path!r})"


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
