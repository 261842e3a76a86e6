"""ValueMesh: flatten, slice and from_indexed (pure: no processes)."""

from __future__ import annotations

import pytest

import otpmesh
from otpmesh import ValueMesh


def _grid() -> ValueMesh[str]:
    return ValueMesh({"hosts": 2, "gpus": 3}, [f"h{h}g{g}" for h in range(2) for g in range(3)])


def test_flatten_keeps_rank_order_along_one_named_dimension() -> None:
    flat = _grid().flatten("ranks")
    assert flat.shape == {"ranks": 6}
    assert flat.item(ranks=4) == "h1g1" and flat.values() == _grid().values()
    with pytest.raises(otpmesh.MeshError, match="flatten\\(name\\) needs a dimension name"):
        _grid().flatten("")


def test_slice_uses_actor_mesh_words() -> None:
    row = _grid().slice(hosts=1)
    assert row.shape == {"gpus": 3} and row.values() == ["h1g0", "h1g1", "h1g2"]
    part = _grid().slice(gpus=slice(1, 3))
    assert part.shape == {"hosts": 2, "gpus": 2}
    assert part.item(hosts=1, gpus=0) == "h1g1"
    with pytest.raises(otpmesh.MeshError, match="no dimension \\['procs'\\]"):
        _grid().slice(procs=0)


def test_from_indexed_takes_every_rank_once_in_any_order() -> None:
    mesh = ValueMesh.from_indexed({"hosts": 2, "gpus": 2}, [(3, "d"), (0, "a"), (2, "c"), (1, "b")])
    assert mesh.values() == ["a", "b", "c", "d"] and mesh.item(hosts=1, gpus=0) == "c"
    with pytest.raises(otpmesh.MeshError, match="no value for rank 1 of shape"):
        ValueMesh.from_indexed({"procs": 2}, [(0, "a")])
    with pytest.raises(otpmesh.MeshError, match="rank 0 is given twice"):
        ValueMesh.from_indexed({"procs": 2}, [(0, "a"), (0, "b"), (1, "c")])


def test_out_of_range_is_an_index_error_that_names_the_size() -> None:
    with pytest.raises(IndexError, match="rank 6 is out of range for a ValueMesh of 6 values"):
        _grid()[6]
    assert _grid()[-1] == "h1g2"
    with pytest.raises(IndexError, match=r"rank 2 is out of range 0\.\.1 for shape"):
        ValueMesh.from_indexed({"procs": 2}, [(2, "x")])
