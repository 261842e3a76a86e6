"""A tree's outline: what a view shows of each node before anything has run.

The live view (``otpmesh run``) builds it from the spec; ``otpmesh watch`` receives it from the
app, as data, since a spec holds classes.
"""

from __future__ import annotations

from ._spec import Mesh, Supervisor, Worker, walk

#: One node: path, kind, detail, restart type, intensity, period (None for a worker).
OutlineRow = tuple[str, str, str, str, int | None, float | None]


def outline(tree: Supervisor | Mesh, parent: str = "") -> list[OutlineRow]:
    """The tree's nodes, parents before children, children in start order; under `parent`
    (the path of the actor that owns it) for an owned subtree."""
    rows: list[OutlineRow] = []
    for path, spec in walk(tree, parent):
        limits = (None, None) if isinstance(spec, Worker) else (spec.intensity, spec.period)
        rows.append((path, type(spec).__name__.lower(), _detail(spec), str(spec.restart), *limits))
    return rows


def _detail(spec: Supervisor | Worker | Mesh) -> str:
    if isinstance(spec, Worker):
        actor = spec.actor
        return actor.__name__ if isinstance(actor, type) else actor.rpartition(":")[2]
    if isinstance(spec, Mesh):
        shape = ",".join(f"{k}={v}" for k, v in spec.shape.items())
        return f"{shape} {spec.strategy}"
    return str(spec.strategy)  # its intensity has a column of its own
