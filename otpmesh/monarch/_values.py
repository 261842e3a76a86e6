"""Monarch's values: ``Point`` (a position in a mesh) and ``ValueMesh`` (one value per point,
what ``call()`` returns), over otpmesh's shapes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from .._core._shape import Coords, Shape, all_coords, rank_of, select

R = TypeVar("R")


class Point(Mapping[str, int]):
    """A position in a mesh: its coordinates by dimension (a mapping), ``rank`` (its index in
    rank order) and ``extent`` (the mesh's sizes)."""

    __slots__ = ("_coords", "extent", "rank")

    def __init__(self, coords: Coords, extent: Shape) -> None:
        self._coords = dict(coords)
        self.extent = dict(extent)
        self.rank = rank_of(self.extent, self._coords) if self.extent else 0

    def __getitem__(self, dim: str) -> int:
        return self._coords[dim]

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def __repr__(self) -> str:
        return f"Point({self._coords}, rank={self.rank})"

    def __str__(self) -> str:
        # Monarch's form: each coordinate out of its size, e.g. {'hosts': 0/1, 'gpus': 1/2}
        inner = ", ".join(f"{d!r}: {c}/{self.extent.get(d, '?')}" for d, c in self._coords.items())
        return "{" + inner + "}"


class ValueMesh(Generic[R]):
    """One value per point of a mesh, by coordinates. Iterating yields ``(Point, value)``
    pairs (Monarch's order: rank order); ``values()`` the values alone."""

    __slots__ = ("_shape", "_values")

    def __init__(self, shape: Shape, values: list[R]) -> None:
        self._shape = dict(shape)
        self._values = list(values)

    @property
    def extent(self) -> Shape:
        return dict(self._shape)

    def item(self, **coords: int) -> R:
        """The value at `coords` (every dimension named); no arguments for a one-value mesh.
        ValueError for a point outside the mesh."""
        if not coords:
            if len(self._values) != 1:
                raise ValueError(
                    f"item() without coordinates needs a one-value mesh; this one has "
                    f"{len(self._values)} (extent {self._shape})"
                )
            return self._values[0]
        try:
            return self._values[rank_of(self._shape, coords)]
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(f"{coords} is not a point of extent {self._shape}: {exc}") from None

    def items(self) -> Iterator[tuple[Point, R]]:
        shape = self._shape
        return ((Point(c, shape), v) for c, v in zip(all_coords(shape), self._values, strict=True))

    def values(self) -> list[R]:
        return list(self._values)

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def __len__(self) -> int:
        return len(self._values)

    def slice(self, **selection: int | slice) -> ValueMesh[R]:
        """The values of part of the mesh (the same words as ``ActorMesh.slice``)."""
        shape, ranks = select(self._shape, **selection)
        return ValueMesh(shape, [self._values[r] for r in ranks])

    def flatten(self, name: str) -> ValueMesh[R]:
        """The same values along one dimension called `name`."""
        return ValueMesh({name: len(self._values)}, self._values)

    @staticmethod
    def from_indexed(extent: Shape, indexed: Mapping[int, R]) -> ValueMesh[R]:
        """A mesh of `extent` from values by rank; every rank must have one."""
        size = 1
        for n in extent.values():
            size *= n
        missing = [rank for rank in range(size) if rank not in indexed]
        if missing or len(indexed) != size:
            raise ValueError(
                f"from_indexed needs one value for each of the {size} ranks of {extent}; "
                f"missing {missing[:8]}, extra {sorted(set(indexed) - set(range(size)))[:8]}"
            )
        return ValueMesh(extent, [indexed[rank] for rank in range(size)])

    def __repr__(self) -> str:
        return f"ValueMesh({self._shape}, {self._values!r})"
