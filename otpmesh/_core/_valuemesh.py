"""ValueMesh: what a call on a whole mesh returns, one value per actor, by coordinates."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from ._errors import MeshError
from ._shape import Coords, Shape, all_coords, check_shape, rank_of, select

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
        n = len(self._values)
        if not -n <= rank < n:  # IndexError, as for a list and an ActorMesh
            raise IndexError(f"rank {rank} is out of range for a ValueMesh of {n} values")
        return self._values[rank]

    def flatten(self, name: str) -> ValueMesh[T]:
        """The same values in rank order, along one dimension called `name`."""
        if not isinstance(name, str) or not name:
            raise MeshError(f"flatten(name) needs a dimension name such as 'ranks', not {name!r}")
        return ValueMesh({name: len(self._values)}, self._values)

    def slice(self, **selection: int | slice) -> ValueMesh[T]:
        """Part of it, with ActorMesh.slice's words: ``gpus=0`` drops the dimension,
        ``gpus=slice(0, 2)`` keeps part of it."""
        shape, ranks = select(self._shape, **selection)
        return ValueMesh(shape, [self._values[r] for r in ranks])

    @classmethod
    def from_indexed(cls, shape: Mapping[str, int], pairs: Iterable[tuple[int, T]]) -> ValueMesh[T]:
        """A ValueMesh of `shape` from (rank, value) pairs, every rank exactly once, in any
        order (as replies arrive)."""
        checked = check_shape(dict(shape), "ValueMesh.from_indexed")
        size = len(all_coords(checked))
        values: dict[int, T] = {}
        for rank, value in pairs:
            if not isinstance(rank, int) or not 0 <= rank < size:
                raise IndexError(f"rank {rank!r} is out of range 0..{size - 1} for shape {checked}")
            if rank in values:
                raise MeshError(f"rank {rank} is given twice; each rank takes one value")
            values[rank] = value
        missing = [r for r in range(size) if r not in values]
        if missing:
            raise MeshError(
                f"no value for rank{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing[:8]))} of shape {checked}: give every rank once"
            )
        return cls(checked, [values[r] for r in range(size)])

    def __repr__(self) -> str:
        return f"ValueMesh({self._shape}, {self._values!r})"
