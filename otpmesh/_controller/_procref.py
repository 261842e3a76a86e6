"""``ProcMeshRef``: a handle to one of the app's proc meshes, usable in any of its processes.

What ``otpmesh.proc_mesh()`` returns inside an actor, and what a ``ProcMesh`` becomes when it
is sent in a message. Every operation is the controller's (``_owned.py``): the processes are its
fork server's children, whoever asks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .._core._actor import Actor, class_path, current_path
from .._core._errors import ProtocolError
from .._core._shape import Shape, select
from .._core._signature import Endpoints
from .._core._spec import ONE_FOR_ONE, PERMANENT, START_TIMEOUT, Restart, Strategy
from .._node._ask import ask_controller
from .._node._future import Future, later
from .._node._mesh import ActorMesh
from .._wire import _codec, _payloads
from .._wire._brief import brief
from ._owners import STOP_TIMEOUT

_FIELDS = (_payloads.STR, _payloads.LIST, _payloads.LIST, (list, type(None)))


class ProcMeshRef:
    """A proc mesh of this app, seen from any process: spawn on it, slice it, stop it."""

    _wire_ext: ClassVar[int] = _codec.EXT_PROC_MESH

    def __init__(
        self, mesh_id: str, shape: Shape, pids: list[int], ranks: list[int] | None = None
    ) -> None:
        self._id = mesh_id
        self._shape = shape
        self._pids = pids
        self._ranks = ranks  # a slice: these ranks of the proc mesh `mesh_id` (None: all)

    def _to_wire(self) -> list[Any]:
        return [self._id, list(self._shape.items()), self._pids, self._ranks]

    @classmethod
    def _from_wire(cls, data: Any) -> ProcMeshRef:
        mesh_id, pairs, pids, ranks = _payloads.fields(data, "proc mesh", _FIELDS)
        shape = _payloads.mesh_shape(pairs, len(pids), "proc mesh")
        if not all(type(p) is int for p in pids):
            raise ProtocolError(f"malformed proc mesh: its pids are {brief(pids)}")
        if ranks is not None and (
            len(ranks) != len(pids) or not all(type(r) is int and r >= 0 for r in ranks)
        ):
            raise ProtocolError(f"malformed proc mesh: its ranks are {brief(ranks)}")
        return cls(mesh_id, shape, pids, ranks)

    @property
    def shape(self) -> Shape:
        return dict(self._shape)

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def __len__(self) -> int:
        return len(self._pids)

    def slice(self, **selection: int | slice) -> ProcMeshRef:
        """Some of these processes (``hosts=0``, ``procs=slice(0, 2)``), as ``ProcMesh.slice``."""
        shape, picked = select(self._shape, **selection)
        ranks = [self._ranks[r] if self._ranks is not None else r for r in picked]
        return ProcMeshRef(self._id, shape, [self._pids[r] for r in picked], ranks)

    def _target(self) -> dict[str, Any]:
        return {
            "id": self._id,
            "ranks": self._ranks,
            "shape": self._shape,
            "owner": current_path(),
        }

    def spawn(
        self, name: str, actor: type[Actor] | str, *args: Any, **kwargs: Any
    ) -> Future[ActorMesh]:
        """As ``ProcMesh.spawn``: one `actor` per process, unsupervised (a Future)."""
        request = dict(self._target(), name=name, cls=_path(actor), args=list(args), kwargs=kwargs)
        return later(f"spawning {name!r}", _spawned, request, actor)

    def spawn_supervised(
        self,
        name: str,
        actor: type[Actor] | str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        strategy: Strategy = ONE_FOR_ONE,
        restart: Restart = PERMANENT,
        intensity: int = 1,
        period: float = 5.0,
        start_timeout: float | None = START_TIMEOUT,
    ) -> Future[ActorMesh]:
        """As ``ProcMesh.spawn_supervised``: a supervisor group, run by the controller."""
        request = dict(
            self._target(),
            name=name,
            cls=_path(actor),
            args=list(args),
            kwargs=dict(kwargs or {}),
            supervision=[str(strategy), str(restart), intensity, period, start_timeout],
        )
        return later(f"spawning {name!r}", _spawned, request, actor)

    def stop(self, timeout: float = STOP_TIMEOUT) -> Future[None]:
        """Stop these processes (their actors' ``on_stop`` first), as ``ProcMesh.stop``."""
        request = dict(self._target(), timeout=float(timeout))
        return later(f"stopping {self!r}", ask_controller, "procs_stop", request)

    async def __aenter__(self) -> ProcMeshRef:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"ProcMeshRef({self._id!r}, {self._shape})"


async def _spawned(request: dict[str, Any], actor: type[Actor] | str) -> ActorMesh:
    mesh: ActorMesh = await ask_controller("procs_spawn", request)
    return with_endpoints(mesh, actor)


def _path(actor: type[Actor] | str) -> str:
    if isinstance(actor, str):
        return actor
    if not (isinstance(actor, type) and issubclass(actor, Actor)):
        raise TypeError(f"spawn needs an otpmesh.Actor subclass, not {actor!r}")
    return class_path(actor)


def with_endpoints(mesh: ActorMesh, actor: type[Actor] | str) -> ActorMesh:
    """`mesh` as the caller's class describes it (the controller need not import the class)."""
    if isinstance(actor, str):
        return mesh
    return ActorMesh(mesh.name, Endpoints.of(actor.endpoints()), mesh.shape, mesh._slots, None)
