"""``MeshFailure``: what an owner's ``__supervise__`` hook is told when an actor of a mesh it
spawned (and does not supervise through a declared subtree) exits abnormally."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .._wire import _codec, _payloads

_FIELDS = (_payloads.STR, _payloads.STR, _payloads.INT, _payloads.STR)


@dataclass(frozen=True, slots=True)
class MeshFailure:
    """An actor of the mesh `mesh` (its path `path`, rank `rank`) exited for `reason`
    (in words). An owner's ``__supervise__(failure)`` returns True when it handled it; anything
    else (or no hook) makes the owner fail with this failure as its reason."""

    mesh: str
    path: str
    rank: int
    reason: str

    _wire_ext: ClassVar[int] = _codec.EXT_MESH_FAILURE  # how it travels (see _codec)

    def _to_wire(self) -> list[Any]:
        return [self.mesh, self.path, self.rank, self.reason]

    @classmethod
    def _from_wire(cls, data: Any) -> MeshFailure:
        mesh, path, rank, reason = _payloads.fields(data, "mesh failure", _FIELDS)
        return cls(mesh, path, rank, reason)

    def __str__(self) -> str:
        return f"{self.path} (rank {self.rank} of mesh {self.mesh}) exited: {self.reason}"

    def report(self) -> str:
        """The failure in words (Monarch's ``MeshFailure.report()``): who, where, and why."""
        return str(self)
