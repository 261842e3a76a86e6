"""ValueMesh: what a call on a whole mesh returns, one value per actor, by coordinates."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from ._errors import MeshError
from ._shape import Coords, Shape, all_coords, rank_of

T = TypeVar("T")


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
