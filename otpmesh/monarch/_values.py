"""Monarch's values: ``Point`` (a position in a mesh) and ``ValueMesh`` (one value per point,
what ``call()`` returns), over otpmesh's shapes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

from .._core._shape import Coords, Shape, rank_of
from .._core._valuemesh import ValueMesh as NativeValueMesh

R = TypeVar("R")


class Extent(dict[str, int]):
    """Monarch's ``Extent``: a mesh's size along each dimension, in order. A dict
    (``extent["gpus"]``) with Monarch's ``labels``, ``sizes`` and ``nelements``;
    ``Extent(["hosts", "gpus"], [2, 4])``."""

    def __init__(self, labels: Iterable[str], sizes: Iterable[int]) -> None:
        labels, sizes = list(labels), list(sizes)
        if len(labels) != len(sizes):
            raise ValueError(f"Extent(labels, sizes): {len(labels)} labels for {len(sizes)} sizes")
        super().__init__(zip(labels, sizes, strict=True))

    @classmethod
    def of(cls, shape: Mapping[str, int]) -> Extent:
        """The extent of `shape` (a dict of sizes)."""
        return cls(shape.keys(), shape.values())

    @property
    def labels(self) -> list[str]:
        return list(self.keys())

    @property
    def sizes(self) -> list[int]:
        return list(self.values())

    @property
    def nelements(self) -> int:
        """How many points: the product of the sizes."""
        n = 1
        for size in self.values():
            n *= size
        return n


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


class ValueMesh(NativeValueMesh[R]):
    """One value per point of a mesh, by coordinates: otpmesh's ValueMesh, with Monarch's
    differences. Iterating yields ``(Point, value)`` pairs (in rank order), ``values()`` the
    values alone; a point outside the mesh is a ValueError."""

    __slots__ = ()

    @property
    def extent(self) -> Extent:
        return Extent.of(self.shape)

    def item(self, **coords: int) -> R:
        """The value at `coords` (every dimension named); no arguments for a one-value mesh."""
        try:
            return super().item(**coords)
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(f"{coords} is not a point of extent {self.shape}: {exc}") from None

    def items(self) -> Iterator[tuple[Point, R]]:  # type: ignore[override]
        shape = self.shape
        return ((Point(c, shape), v) for c, v in super().items())

    def __iter__(self) -> Iterator[tuple[Point, R]]:  # type: ignore[override]
        return self.items()

    def slice(self, **selection: int | slice) -> ValueMesh[R]:
        part = super().slice(**selection)
        return ValueMesh(part.shape, part.values())

    def flatten(self, name: str) -> ValueMesh[R]:
        return ValueMesh({name: len(self)}, self.values())

    @classmethod
    def from_indexed(
        cls, extent: Mapping[str, int], indexed: Mapping[int, R] | Iterable[tuple[int, R]]
    ) -> ValueMesh[R]:
        """A mesh of `extent` from values by rank (a mapping, or (rank, value) pairs); every
        rank exactly once, else ValueError."""
        pairs = indexed.items() if isinstance(indexed, Mapping) else indexed
        try:
            made = super().from_indexed(extent, pairs)
        except IndexError as exc:
            raise ValueError(str(exc)) from None
        return ValueMesh(made.shape, made.values())
