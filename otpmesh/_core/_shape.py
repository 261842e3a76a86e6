"""Mesh shapes: ordered named dimensions, row-major ranks, and slicing."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ._errors import MeshError

Shape = dict[str, int]
Coords = dict[str, int]


def check_shape(shape: Mapping[str, Any], what: str = "proc_mesh") -> Shape:
    """Validate a shape given as keyword arguments: non-empty, names to positive ints."""
    if not shape:
        raise MeshError(f"{what} needs at least one dimension, e.g. {what}(procs=4) or gpus=8")
    out: Shape = {}
    for name, size in shape.items():
        if not name.isidentifier():
            raise MeshError(f"{what}: dimension name {name!r} is not an identifier")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise MeshError(f"{what}: dimension {name}={size!r} must be a positive int")
        out[name] = size
    return out


def all_coords(shape: Shape) -> list[Coords]:
    """Every point of `shape` in rank (row-major) order."""
    names = list(shape)
    return [
        dict(zip(names, point, strict=True))
        for point in itertools.product(*(range(n) for n in shape.values()))
    ]


def rank_of(shape: Shape, coords: Mapping[str, int]) -> int:
    """The flat rank of `coords` in `shape`; every dimension must be given."""
    if set(coords) != set(shape):
        raise MeshError(
            f"coordinates {dict(coords)} do not match the mesh dimensions {list(shape)}"
        )
    rank = 0
    for name, size in shape.items():
        index = coords[name]
        if not 0 <= index < size:
            raise MeshError(f"coordinate {name}={index} is out of range 0..{size - 1}")
        rank = rank * size + index
    return rank


def select(shape: Shape, **selection: int | slice) -> tuple[Shape, list[int]]:
    """Slice `shape`: an int drops a dimension, a slice keeps it. Returns the new shape and the
    old ranks of the selected points, in the new shape's rank order."""
    unknown = set(selection) - set(shape)
    if unknown:
        raise MeshError(f"no dimension {sorted(unknown)} in a mesh with dimensions {list(shape)}")
    new_shape: Shape = {}
    per_dim: list[range | list[int]] = []
    for name, size in shape.items():
        sel = selection.get(name, slice(None))
        if isinstance(sel, slice):
            picked = range(*sel.indices(size))
            if not picked:
                raise MeshError(f"slice {name}={sel} selects nothing (size {size})")
            new_shape[name] = len(picked)
            per_dim.append(picked)
        elif isinstance(sel, int) and not isinstance(sel, bool):
            index = sel + size if sel < 0 else sel
            if not 0 <= index < size:
                raise MeshError(f"index {name}={sel} is out of range for size {size}")
            per_dim.append([index])
        else:
            raise MeshError(f"slice {name}={sel!r}: use an int or a slice")
    names = list(shape)
    ranks = [
        rank_of(shape, dict(zip(names, point, strict=True)))
        for point in itertools.product(*per_dim)
    ]
    return new_shape, ranks
