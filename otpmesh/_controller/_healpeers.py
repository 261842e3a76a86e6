"""Which members of a healing mesh a restarted one may take its state from (``Mesh(heal=...)``).

A peer must hold state that survived the failure: a member started *after* the exit that
restarted this one was itself restarted by it (``ONE_FOR_ALL`` restarts them one by one, in rank
order), so it holds only what its own heal or fallback gave it, and taking state from it would
hide the fallback the spec declared. So: the members the supervisor has running that were
started before the last exit it heard of, lowest rank first (every member holds the same state
in a replicated mesh; the order only makes the choice reproducible). Pure: the driver tells it
what happened.

A mesh may also name other meshes to heal from (``Heal(from_="rl/dp_b")``: a replica group of
its own, typically a process group, none of whose members survives its own failure); there the
peer is the member of the same rank (the same shard), if it is up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .._core._healspec import PEER
from .._core._spec import Mesh
from .._core._spec_errors import SpecError


class PeerChoice:
    """The survivors of a mesh's supervisor, for the heal of each member it restarts."""

    def __init__(self) -> None:
        self._exits = 0  # exits heard so far
        self._since: dict[str, int] = {}  # member id -> exits heard when it was started

    def exited(self) -> None:
        """A member exited (any reason): the members started from now on did not survive it."""
        self._exits += 1

    def started(self, child_id: str) -> None:
        self._since[child_id] = self._exits

    def peers(self, child_id: str, running: Iterable[str]) -> list[str]:
        """The members of `running` (ids the supervisor has running) that `child_id` may heal
        from, in the order to ask them."""
        survivors = [
            c for c in running if c != child_id and self._since.get(c, self._exits) < self._exits
        ]
        return sorted(survivors, key=int)


def check_sources(path: str, mesh: Mesh, specs: Mapping[str, object]) -> None:
    """The other meshes `mesh` (at `path`) heals from are meshes of its shape in this tree,
    started before it (when it is learned, they must be known)."""
    if mesh.heal is None or isinstance(mesh.heal, str):
        return
    for source in mesh.heal.from_:
        if source == PEER:
            continue
        other = specs.get(source)
        if not isinstance(other, Mesh) or dict(other.shape) != dict(mesh.shape) or source == path:
            found = "nothing" if other is None else f"{type(other).__name__} {source!r}"
            raise SpecError(
                f"Mesh {path!r}",
                "heal",
                mesh.heal,
                "'peer' or the paths of other Meshes of the same shape in the tree",
                f"from_ names {source!r}, where the tree has {found}"
                + (f" of shape {dict(other.shape)}" if isinstance(other, Mesh) else ""),
            )
