"""Which tree of an app a path belongs to, when actors own subtrees.

An owned subtree runs under its owner's path (owner ``rl/svc``, Mesh ``replicas``:
``rl/svc/replicas/0``) and writes to the owner's tree's event log. A path belongs to the tree
of its nearest owner above it ("" for the controller's own tree): a worker has no children in
its own tree, so every supervisor under an owner's path is its subtree's (or a deeper one's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .._core._spec import ChildSpec, Mesh, Supervisor, Worker, walk
from .._core._supevents import LogEntry

#: Owner path -> the spec its actor starts (``otpmesh.context().start(spec)``).
Owned = Mapping[str, Supervisor | Mesh]


def tree_of(path: str, owners: Iterable[str]) -> str:
    """The owner whose subtree `path` is in (the nearest one above it), or "" for the top."""
    return max((o for o in owners if path.startswith(o + "/")), key=len, default="")


def per_tree(entries: Iterable[LogEntry], owners: Iterable[str]) -> dict[str, list[LogEntry]]:
    """`entries` split by the tree whose supervisor wrote each, every list in log order."""
    owners = list(owners)
    trees: dict[str, list[LogEntry]] = {}
    for entry in entries:
        trees.setdefault(tree_of(entry.path, owners), []).append(entry)
    return trees


def owned_walk(tree: Supervisor | Mesh, owned: Owned) -> list[tuple[str, ChildSpec]]:
    """Every (path, spec) of `tree` and of the subtrees its workers own, at any depth: each
    subtree right after its owner (mesh slots included)."""
    out: list[tuple[str, ChildSpec]] = []

    def visit(spec: Supervisor | Mesh, prefix: str) -> None:
        for path, node in walk(spec, prefix):
            out.append((path, node))
            if isinstance(node, Worker) and path in owned:
                visit(owned[path], path)

    visit(tree, "")
    return out


def worker_paths(tree: Supervisor | Mesh) -> list[str]:
    """Every worker path of `tree` (mesh slots included), in start order."""
    return [path for path, spec in walk(tree) if isinstance(spec, Worker)]


def check_owned(tree: Supervisor | Mesh, owned: Owned) -> None:
    """Every owner path names a worker of `tree` or of an owned subtree; every value is a
    Supervisor or Mesh spec."""
    for owner, spec in owned.items():
        if not isinstance(spec, Supervisor | Mesh):
            raise TypeError(
                f"owned[{owner!r}] must be the Supervisor or Mesh spec its actor starts, "
                f"not {spec!r}"
            )
    workers = {p for p, s in owned_walk(tree, owned) if isinstance(s, Worker)}
    unknown = sorted(set(owned) - workers)
    if unknown:
        raise ValueError(
            f"owned names {unknown}, which are not worker paths of {tree.id}; owner paths are "
            f"workers' paths, e.g. {sorted(workers)[:4]}"
        )
